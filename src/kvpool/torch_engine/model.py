"""One readable decoder for Llama, Qwen3, Mistral, Gemma 2, Gemma 3 text and
Mixtral (its MoE MLP lives in moe.py).

Module and parameter names follow transformers' checkpoints
(`model.layers.3.self_attn.q_proj.weight`, ...), so a Hugging Face state dict
loads as is. The architectures differ only in switches read into `ArchConfig`:
Qwen3 and Gemma 3 normalise q and k per head; Gemma 3 also uses (1 + w)
RMSNorm computed in float32, a norm after attention and around the MLP, a
sqrt(hidden) embedding scale, `query_pre_attn_scalar`, gelu-tanh, and
different RoPE bases for its local and global layers; Mistral and Gemma 3's
local layers attend through a sliding window (the mask lives in attention.py).

Tokens travel flat ([T, hidden]); attention is a callback so that the same
weights run densely (parity with transformers) or over kvpool pages.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kvpool.torch_engine.arch import ArchConfig, Rope

# attend(layer, q [T,H,D], k [T,KVH,D], v [T,KVH,D]) -> [T,H,D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    """Llama RMSNorm (`w * x.to(dtype)`) or Gemma's (`(x * (1 + w)).to(dtype)`)."""

    def __init__(self, dim: int, eps: float, gemma: bool):
        super().__init__()
        self.eps, self.gemma = eps, gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (normed * (1.0 + self.weight.float())).type_as(x)
        return self.weight * normed.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [T, heads, D] with cos/sin [T, D] (halves rotated, as in HF)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.gemma) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.gemma) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int, attend: AttendFn
    ) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.heads, self.head_dim)
        k = self.k_proj(x).view(t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = attend(layer, q, k, v)
        projected: torch.Tensor = self.o_proj(out.reshape(t, self.heads * self.head_dim))
        return projected


class MLP(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.tanh_gelu = cfg.activation in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new")
        if not self.tanh_gelu and cfg.activation != "silu":
            from kvpool.torch_engine.arch import EngineError

            raise EngineError(f"activation {cfg.activation!r} is not supported by the reference engine")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        act = F.gelu(gate, approximate="tanh") if self.tanh_gelu else F.silu(gate)
        down: torch.Tensor = self.down_proj(act * self.up_proj(x))
        return down


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, index: int):
        super().__init__()
        eps, gemma = cfg.rms_norm_eps, cfg.gemma
        self.self_attn = Attention(cfg)
        if cfg.moe_layers and cfg.moe_layers[index]:
            from kvpool.torch_engine.moe import SparseMoE

            self.mlp: nn.Module = SparseMoE(cfg)
        else:
            self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, gemma)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, gemma)
        # Gemma's sandwich: norm after attention (above) and around the MLP.
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps, gemma) if gemma else None
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps, gemma) if gemma else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int, attend: AttendFn
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos, sin, layer, attend)
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            x = x + attn
            mlp: torch.Tensor = self.mlp(self.post_attention_layernorm(x))
            return x + mlp
        x = x + self.post_attention_layernorm(attn)
        sandwiched: torch.Tensor = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x + sandwiched


class Backbone(nn.Module):
    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma)


class DecoderLM(nn.Module):
    """The causal LM. `forward` takes flat token ids and positions and returns
    logits of the tokens picked by `logits_index` (all when None)."""

    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._ropes: list[Rope] = sorted(set(cfg.ropes), key=cfg.ropes.index)
        self._rope_of_layer = [self._ropes.index(r) for r in cfg.ropes]
        for i, rope in enumerate(self._ropes):
            self.register_buffer(f"inv_freq_{i}", rope.inv_freq(cfg.head_dim), persistent=False)
        # A buffer, not a tensor made per call: no host-to-device copy inside a CUDA graph.
        self.register_buffer("embed_scale", torch.tensor(cfg.hidden_size**0.5), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cfg = self.cfg
        x = self.model.embed_tokens(input_ids)
        if cfg.gemma:
            # Gemma scales embeddings by sqrt(hidden) rounded to the weight dtype.
            scale = self.get_buffer("embed_scale")
            x = x * scale.to(x.dtype)
        tables = []
        for i in range(len(self._ropes)):
            inv_freq = self.get_buffer(f"inv_freq_{i}")
            freqs = positions[:, None].float() * inv_freq[None].float()
            emb = torch.cat((freqs, freqs), dim=-1)
            factor = self._ropes[i].attention_factor  # yarn scales cos and sin
            cos, sin = (emb.cos(), emb.sin()) if factor == 1.0 else (emb.cos() * factor, emb.sin() * factor)
            tables.append((cos.to(x.dtype), sin.to(x.dtype)))
        for layer, block in enumerate(self.model.layers):
            cos, sin = tables[self._rope_of_layer[layer]]
            x = block(x, cos, sin, layer, attend)
        if logits_index is not None:
            x = x[logits_index]
        x = self.model.norm(x)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, weight)
        if cfg.final_logit_softcap is not None:
            logits = torch.tanh(logits / cfg.final_logit_softcap) * cfg.final_logit_softcap
        return logits

    @torch.no_grad()
    def dense_logits(self, input_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Logits [S, vocab] of one sequence run densely from position 0 (no
        pages, no cache): the baseline for parity with transformers."""
        from kvpool.torch_engine.attention import dense_attention

        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        cfg = self.cfg

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_attention(cfg.windows[layer], q, k, v, cfg.attn_scale, cfg.attn_logit_softcap)

        return self.forward(ids, torch.arange(len(ids), device=self.device), attend)
