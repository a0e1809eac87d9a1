"""What the reference decoder needs to know about an architecture, read from a
Hugging Face config dict: sizes, per-layer attention window, RoPE tables and the
handful of switches that tell Llama, Qwen3, Mistral, Gemma 2 and Gemma 3 apart."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.spec.families import layer_types
from kvpool.torch_engine.errors import EngineError as EngineError
from kvpool.torch_engine.errors import StalePageError as StalePageError
from kvpool.torch_engine.fields import check_fields
from kvpool.torch_engine.names import ARCHS as ARCHS

# model_type (config.json) -> our architecture switch
MODEL_TYPES = {
    "llama": "llama",
    "qwen3": "qwen3",
    "qwen2": "llama",
    "mistral": "mistral",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "gemma2": "gemma2",
    "mixtral": "mistral",
    "qwen3_moe": "qwen3",
}


@dataclass(frozen=True)
class Rope:
    """One RoPE table: `rope_theta` plus an optional scaling rule."""

    theta: float
    kind: str = "default"  # default | linear | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    beta_fast: float = 32.0  # yarn: rotations above which a dimension is kept
    beta_slow: float = 1.0  # yarn: rotations below which it is fully interpolated
    truncate: bool = True  # yarn: round the ramp's ends to whole dimensions
    attention_factor: float = 1.0  # yarn: cos and sin are multiplied by it

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """Inverse frequencies in float32 (the dtype transformers computes them in)."""
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        if self.kind == "linear":
            return inv / self.factor
        if self.kind == "llama3":
            # Llama 3.1: long wavelengths are divided by `factor`, short ones kept,
            # the band in between blends the two linearly in 1/wavelength.
            low_wavelen = self.original_max_positions / self.low_freq_factor
            high_wavelen = self.original_max_positions / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_positions / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            blended = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return torch.where(medium, blended, scaled)
        if self.kind == "yarn":
            return self._yarn(inv, head_dim)
        return inv

    def _yarn(self, inv: torch.Tensor, dim: int) -> torch.Tensor:
        """YaRN (arXiv 2309.00071): dimensions that turn more than `beta_fast`
        times over the original context keep their frequency, those turning
        fewer than `beta_slow` times are divided by `factor`, a linear ramp
        in between, as transformers computes it."""

        def boundary(rotations: float) -> float:
            return dim * math.log(self.original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low, high = boundary(self.beta_fast), boundary(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (keep), 0: interpolate (divide by factor)
        return inv / self.factor * (1 - keep) + inv * keep

    @classmethod
    def from_params(cls, params: Mapping[str, Any], default_theta: float) -> Rope:
        kind = str(params.get("rope_type") or params.get("type") or "default")
        if kind not in ("default", "linear", "llama3", "yarn"):
            raise EngineError(f"RoPE type {kind!r} is not supported by the reference engine")
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise EngineError("partial_rotary_factor != 1 is not supported by the reference engine")
        if kind == "yarn":
            return cls._yarn_from(params, default_theta)
        return cls(
            theta=float(params.get("rope_theta", default_theta)),
            kind=kind,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_positions=int(params.get("original_max_position_embeddings", 8192)),
        )

    @classmethod
    def _yarn_from(cls, params: Mapping[str, Any], default_theta: float) -> Rope:
        for needed in ("factor", "original_max_position_embeddings"):
            if params.get(needed) is None:
                raise EngineError(f"yarn RoPE without {needed} is not supported by the reference engine")
        factor = float(params["factor"])

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = params.get("attention_factor")
        if attention is None:
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            attention = mscale(factor, float(m)) / mscale(factor, float(m_all)) if m and m_all else mscale(factor)
        return cls(
            theta=float(params.get("rope_theta", default_theta)),
            kind="yarn",
            factor=factor,
            original_max_positions=int(params["original_max_position_embeddings"]),
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            truncate=bool(params.get("truncate", True)),
            attention_factor=float(attention),
        )


@dataclass(frozen=True)
class ArchConfig:
    """Everything the decoder reads from a config; `windows[i]` is layer i's
    sliding window (None = full attention) and `ropes[i]` its RoPE table."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    windows: tuple[int | None, ...]
    ropes: tuple[Rope, ...]
    attn_scale: float
    activation: str = "silu"
    qk_norm: bool = False
    gemma: bool = False  # (1+w) norms, sandwich norms, sqrt(hidden) embedding scale
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias: bool = False  # Qwen2: q/k/v projections have a bias, o_proj none
    mlp_bias: bool = False
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None
    eos_token_ids: tuple[int, ...] = ()  # every stop id (config.json, generation_config.json)
    num_experts: int = 0  # > 0: a sparse MoE MLP in the layers `moe_layers` names (torch_engine/moe.py)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0  # each expert's MLP width (Qwen-MoE; Mixtral's is intermediate_size)
    norm_topk_prob: bool = True  # renormalise the top-k weights (Mixtral always; Qwen-MoE per config)
    moe_layers: tuple[bool, ...] = ()  # per layer: MoE (True) or the dense MLP

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> ArchConfig:
        """Read a Hugging Face config dict (a Gemma 3 `text_config` is followed).
        Raises `EngineError` for an architecture the engine does not implement."""
        if isinstance(config.get("text_config"), Mapping):
            config = {**{k: v for k, v in config.items() if k != "text_config"}, **config["text_config"]}
        model_type = str(config.get("model_type", ""))
        arch = MODEL_TYPES.get(model_type)
        if arch is None:
            raise EngineError(
                f"model_type {model_type!r} is not supported by the reference engine; "
                f"supported: {', '.join(sorted(MODEL_TYPES))}"
            )
        try:
            return cls._build(arch, config)
        except (KeyError, TypeError, ValueError) as e:
            raise EngineError(f"config of a {model_type} model has a missing or bad field: {e}") from None

    @classmethod
    def _build(cls, arch: str, config: Mapping[str, Any]) -> ArchConfig:
        check_fields(config)
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        n = int(config["num_hidden_layers"])
        # The same per-layer reading kvpool.spec uses to build the pool groups,
        # so the engine's windows and the manager's groups cannot disagree.
        types = layer_types(config)
        window = int(config["sliding_window"]) if "sliding_attention" in types else None
        windows = tuple(window if t == "sliding_attention" else None for t in types)
        # Gemma 2 and 3 share norms, embedding scale and query_pre_attn_scalar;
        # Gemma 2 has one RoPE table, no q/k norm, and softcaps attention logits.
        gemma = arch in ("gemma3", "gemma2")
        ropes = cls._ropes(config, types, arch == "gemma3")
        eos = config.get("eos_token_id")
        eos_ids = tuple(int(t) for t in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
        return cls(
            arch=arch,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=n,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            windows=windows,
            ropes=ropes,
            attn_scale=float(config.get("query_pre_attn_scalar", 256)) ** -0.5 if gemma else head_dim**-0.5,
            activation=str(config.get("hidden_activation") or config.get("hidden_act") or "silu"),
            qk_norm=arch in ("qwen3", "gemma3"),
            gemma=gemma,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", gemma)),
            attention_bias=bool(config.get("attention_bias", False)),
            qkv_bias=bool(config.get("attention_bias", False)) or config.get("model_type") == "qwen2",
            mlp_bias=bool(config.get("mlp_bias", False)),
            final_logit_softcap=config.get("final_logit_softcapping"),
            # transformers' Gemma 3 reads attn_logit_softcapping but never applies
            # it; only Gemma 2 caps attention logits.
            attn_logit_softcap=config.get("attn_logit_softcapping") if arch == "gemma2" else None,
            eos_token_ids=eos_ids,
            **cls._moe(config, n),
        )

    @staticmethod
    def _moe(config: Mapping[str, Any], n: int) -> dict[str, Any]:
        """The MoE fields: Mixtral routes every layer and renormalises; Qwen3-MoE
        routes layer i when i is not in `mlp_only_layers` and (i + 1) is a
        multiple of `decoder_sparse_step`, renormalising when `norm_topk_prob`
        (transformers' Qwen3MoeDecoderLayer and Qwen3MoeTopKRouter)."""
        model_type = config.get("model_type")
        if model_type == "mixtral":
            return _mixtral_moe(config, n)
        return _qwen3_moe(config, n) if model_type == "qwen3_moe" else {}

    @staticmethod
    def _ropes(config: Mapping[str, Any], types: list[str], gemma: bool) -> tuple[Rope, ...]:
        params = config.get("rope_parameters")
        if gemma:
            local, glob = _gemma_ropes(config)
            return tuple(local if t == "sliding_attention" else glob for t in types)
        if isinstance(params, Mapping):
            rope = Rope.from_params(params, 10_000.0)
        else:
            rope = Rope.from_params(
                {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 10_000.0)},
                10_000.0,
            )
        return tuple(rope for _ in types)


def _gemma_ropes(config: Mapping[str, Any]) -> tuple[Rope, Rope]:
    """Gemma's (local, global) RoPE: local layers rotate with base 10k, global ones
    with 1M (+ scaling). transformers 5 keeps one dict per layer type; older
    configs use rope_local_base_freq / rope_theta / rope_scaling."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and "full_attention" in params:
        local = Rope.from_params(params.get("sliding_attention") or {}, 10_000.0)
        return local, Rope.from_params(params.get("full_attention") or {}, 1_000_000.0)
    local = Rope(float(config.get("rope_local_base_freq", 10_000.0)))
    scaling = {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 1_000_000.0)}
    return local, Rope.from_params(scaling, 1_000_000.0)


def _qwen3_moe(config: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Qwen3-MoE's fields: layer i routed when not in `mlp_only_layers` and (i + 1)
    a multiple of `decoder_sparse_step`; renormalised when `norm_topk_prob`."""
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    step, dense = int(config.get("decoder_sparse_step") or 1), set(config.get("mlp_only_layers") or ())
    return {
        "num_experts": experts,
        "experts_per_token": int(config.get("num_experts_per_tok") or 0),
        "moe_intermediate_size": int(config["moe_intermediate_size"]),
        "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        "moe_layers": tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n)),
    }


def _mixtral_moe(config: Mapping[str, Any], n: int) -> dict[str, Any]:
    """Mixtral's MoE fields: every layer routed, weights renormalised."""
    experts = int(config.get("num_local_experts") or 0)
    return {
        "num_experts": experts,
        "experts_per_token": int(config.get("num_experts_per_tok") or 0),
        "moe_intermediate_size": int(config["intermediate_size"]),
        "moe_layers": (experts > 0,) * n,
    }
