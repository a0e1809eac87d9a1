"""Hybrid attention + Mamba families: attention layers plus one `state` group.

Mamba (selective SSM) layers keep, per request, a causal-convolution window and
an SSM state; both stay in the dtype the model is served in (engines do not
quantise them with the KV dtype) and split over tensor-parallel ranks with the inner channels:

    conv  = (d_inner / tp) x (d_conv - 1)   values  (the last d_conv - 1 inputs)
    ssm   = (d_inner / tp) x d_state        values
    d_inner = mamba_expand x hidden_size

(vLLM's Mamba-1 state shapes; transformers' own cache keeps d_conv conv columns,
one more than an engine needs.) The SSM part is kept in `Context.ssm_dtype` when
given (vLLM's `--mamba-ssm-cache-dtype`, e.g. float32 as Jamba's and Falcon-H1's
model cards recommend), else in the served dtype (vLLM's `auto`; Nemotron-H: its
config's `mamba_ssm_cache_dtype`, float32 by default).
"""

from __future__ import annotations

from kvpool.errors import SpecError
from kvpool.spec.dtypes import model_dtype, row_bytes, served_dtype
from kvpool.spec.families import (
    Config,
    Context,
    LayerCache,
    attention_kv,
    head_dim,
    kv_heads,
    need,
    split_heads,
)


def jamba_layer_types(config: Config) -> list[str]:
    """Layer i is attention when i % attn_layer_period == attn_layer_offset
    (transformers JambaConfig.layers_block_type), Mamba otherwise."""
    n = int(need(config, "num_hidden_layers"))
    period, offset = int(config["attn_layer_period"]), int(config["attn_layer_offset"])
    if offset >= period:  # no layer would be attention (JambaConfig refuses it too)
        raise SpecError(f"attn_layer_offset ({offset}) must be smaller than attn_layer_period ({period})")
    return ["attention" if i % period == offset else "mamba" for i in range(n)]


def mamba1_state_parts(config: Config, ctx: Context) -> tuple[int, int]:
    """One Mamba-1 layer's state per request as its two buffers (conv, SSM), bytes,
    one rank's share: engines keep them as separate tensors (TensorRT-LLM V2 as two
    buffers of one SSM layer, each its own pool)."""
    d_inner = int(config["mamba_expand"]) * int(need(config, "hidden_size"))
    per_rank = -(-d_inner // ctx.tp_size)
    conv = per_rank * (int(config["mamba_d_conv"]) - 1)
    ssm = per_rank * int(config["mamba_d_state"])
    return row_bytes(conv, served_dtype(config)), row_bytes(ssm, ctx.ssm_dtype or served_dtype(config))


def jamba(config: Config, ctx: Context) -> list[LayerCache]:
    """Jamba: full-attention layers (GQA KV) and Mamba-1 layers (one state slot)."""
    kv = attention_kv(kv_heads(config), head_dim(config), ctx)
    parts = mamba1_state_parts(config, ctx)
    out = []
    for i, t in enumerate(jamba_layer_types(config)):
        if t == "attention":
            out.append(LayerCache("full", "full", i, kv))
        else:
            out.append(LayerCache("mamba_state", "state", i, state_bytes=sum(parts), buffers=parts))
    return out


def mamba2_state_parts(config: Config, ctx: Context, prefix: str = "mamba_") -> tuple[int, int]:
    """One Mamba-2 layer's state per request as its (conv, SSM) buffers, bytes, one
    rank's share (vLLM's Mamba-2 state shapes): with H heads of P channels, G groups,
    N states, K taps,

        conv = (H*P + 2*G*N) / tp x (K - 1)     ssm = H/tp x P x N

    Fewer groups than ranks are replicated (one group per rank)."""
    heads = split_heads(int(need(config, f"{prefix}n_heads")), ctx.tp_size)
    groups = split_heads(int(need(config, f"{prefix}n_groups")), ctx.tp_size)
    p, n = int(need(config, f"{prefix}d_head")), int(need(config, f"{prefix}d_state"))
    conv = (heads * p + 2 * groups * n) * (int(need(config, f"{prefix}d_conv")) - 1)
    return row_bytes(conv, served_dtype(config)), row_bytes(heads * p * n, ctx.ssm_dtype or served_dtype(config))


def granite_hybrid(config: Config, ctx: Context) -> list[LayerCache]:
    """Granite-4.0-H: `layer_types` names each layer `attention` or `mamba`
    (transformers reads them as full_attention / linear_attention)."""
    n = int(need(config, "num_hidden_layers"))
    types = [str(t) for t in need(config, "layer_types")][:n]
    if len(types) < n:
        raise SpecError(f"layer_types has {len(types)} entries for {n} layers")
    kv = attention_kv(kv_heads(config), head_dim(config), ctx)
    parts = mamba2_state_parts(config, ctx)
    out = []
    for i, t in enumerate(types):
        if t in ("attention", "full_attention"):
            out.append(LayerCache("full", "full", i, kv))
        elif t in ("mamba", "linear_attention"):
            out.append(LayerCache("mamba_state", "state", i, state_bytes=sum(parts), buffers=parts))
        else:
            raise SpecError(f"layer {i}: unsupported layer type {t!r}")
    return out


_NEMOTRON_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def nemotron_h(config: Config, ctx: Context) -> list[LayerCache]:
    """Nemotron-H: `hybrid_override_pattern` names each block, M = Mamba-2,
    * = attention, - = MLP and E = MoE (no cache). The SSM state is kept in
    `mamba_ssm_cache_dtype` (float32 by transformers' NemotronHConfig default),
    the conv window in the model dtype."""
    pattern = str(need(config, "hybrid_override_pattern"))
    n = int(config.get("num_hidden_layers") or len(pattern))
    if len(pattern) != n or any(c not in _NEMOTRON_BLOCKS for c in pattern):
        # transformers' NemotronHConfig takes the pattern's length and only warns that
        # num_hidden_layers disagrees: a guess either way could plan the wrong layers
        raise SpecError(
            f"hybrid_override_pattern has {len(pattern)} letters for {n} layers (num_hidden_layers); "
            "it needs one of M*-E per layer"
        )
    heads = split_heads(int(need(config, "mamba_num_heads")), ctx.tp_size)
    groups = split_heads(int(need(config, "n_groups")), ctx.tp_size)
    p, s = int(need(config, "mamba_head_dim")), int(need(config, "ssm_state_size"))
    conv = row_bytes((heads * p + 2 * groups * s) * (int(need(config, "conv_kernel")) - 1), served_dtype(config))
    ssm_dtype = ctx.ssm_dtype or model_dtype({"torch_dtype": config.get("mamba_ssm_cache_dtype", "float32")})
    parts = (conv, row_bytes(heads * p * s, ssm_dtype))
    kv = attention_kv(kv_heads(config), head_dim(config), ctx)
    out = []
    for i, c in enumerate(pattern[:n]):
        if c == "*":
            out.append(LayerCache("full", "full", i, kv))
        elif c == "M":
            out.append(LayerCache("mamba_state", "state", i, state_bytes=sum(parts), buffers=parts))
    return out


def falcon_h1(config: Config, ctx: Context) -> list[LayerCache]:
    """Falcon-H1: every layer runs attention and a Mamba-2 mixer side by side, so
    every layer has KV rows and a Mamba-2 state (same formula as Granite-4.0-H)."""
    n = int(need(config, "num_hidden_layers"))
    kv = attention_kv(kv_heads(config), head_dim(config), ctx)
    parts = mamba2_state_parts(config, ctx)
    out = [LayerCache("full", "full", i, kv) for i in range(n)]
    out += [LayerCache("mamba_state", "state", i, state_bytes=sum(parts), buffers=parts) for i in range(n)]
    return out
