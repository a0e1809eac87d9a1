"""Hybrid attention + Mamba families: attention layers plus one `state` group.

Mamba (selective SSM) layers keep, per request, a causal-convolution window and
an SSM state; both stay in the model dtype (engines do not quantise them with the
KV dtype) and split over tensor-parallel ranks with the inner channels:

    conv  = (d_inner / tp) x (d_conv - 1)   values  (the last d_conv - 1 inputs)
    ssm   = (d_inner / tp) x d_state        values
    d_inner = mamba_expand x hidden_size

(vLLM's Mamba-1 state shapes; transformers' own cache keeps d_conv conv columns,
one more than an engine needs.)
"""

from __future__ import annotations

from kvpool.spec.dtypes import model_dtype, row_bytes
from kvpool.spec.families import Config, Context, LayerCache, attention_kv, head_dim, kv_heads, need


def jamba_layer_types(config: Config) -> list[str]:
    """Layer i is attention when i % attn_layer_period == attn_layer_offset
    (transformers JambaConfig.layers_block_type), Mamba otherwise."""
    n = int(need(config, "num_hidden_layers"))
    period, offset = int(config["attn_layer_period"]), int(config["attn_layer_offset"])
    return ["attention" if i % period == offset else "mamba" for i in range(n)]


def mamba1_state_bytes(config: Config, ctx: Context) -> int:
    """One Mamba-1 layer's state per request (conv + SSM), bytes, one rank's share."""
    d_inner = int(config["mamba_expand"]) * int(need(config, "hidden_size"))
    per_rank = -(-d_inner // ctx.tp_size)
    conv = per_rank * (int(config["mamba_d_conv"]) - 1)
    ssm = per_rank * int(config["mamba_d_state"])
    return row_bytes(conv + ssm, model_dtype(config))


def jamba(config: Config, ctx: Context) -> list[LayerCache]:
    """Jamba: full-attention layers (GQA KV) and Mamba-1 layers (one state slot)."""
    kv = attention_kv(kv_heads(config), head_dim(config), ctx)
    state = mamba1_state_bytes(config, ctx)
    out = []
    for i, t in enumerate(jamba_layer_types(config)):
        if t == "attention":
            out.append(LayerCache("full", "full", i, kv))
        else:
            out.append(LayerCache("mamba_state", "state", i, state_bytes=state))
    return out
