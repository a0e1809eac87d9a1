"""Families whose attention layers differ from one another in heads or head
size, so one model-wide (KV heads, head_dim) pair cannot describe them:

- MiMo-V2-Flash (`mimo_v2_flash`): sliding-window layers keep twice the KV
  heads of the full layers, and V is narrower than K (`v_head_dim`);
- Llama-Nemotron NAS (`nemotron-nas`, DeciLM): `block_configs` gives every
  layer its own KV head count, and some layers have no attention at all.

K and V are each one row of `heads_per_rank x head size` values (priced
separately, since NVFP4 rounds each row to its 16-value blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec.dtypes import row_bytes
from kvpool.spec.families import Config, Context, LayerCache, need, split_heads


def kv_row(heads: int, k_dim: int, v_dim: int, ctx: Context) -> int:
    """Bytes per position of one layer: K (`k_dim`) and V (`v_dim`) rows of one rank's heads."""
    h = split_heads(heads, ctx.tp_size)
    return row_bytes(h * k_dim, ctx.kv_dtype) + row_bytes(h * v_dim, ctx.kv_dtype)


def mimo_v2_flash(config: Config, ctx: Context) -> list[LayerCache]:
    """MiMo-V2-Flash, as transformers' MiMoV2FlashConfig / MiMoV2FlashAttention read it:

    - `hybrid_layer_pattern[i]` is 1 for a sliding-window layer, 0 for full
      attention (without it, the class default: layer 0 and every 6th layer full);
    - the window covers `sliding_window_size` earlier positions plus the query,
      so W = sliding_window_size + 1 (the class sets sliding_window to that);
    - full layers: `num_key_value_heads` heads, K `head_dim`, V `v_head_dim`;
      sliding layers: `swa_num_key_value_heads` / `swa_head_dim` /
      `swa_v_head_dim`, by default twice the KV heads and the same sizes.
    """
    n = int(need(config, "num_hidden_layers"))
    pattern = config.get("hybrid_layer_pattern")
    if pattern is not None:
        if (
            not isinstance(pattern, list)
            or len(pattern) < n
            or any(isinstance(p, bool) or p not in (0, 1) for p in pattern[:n])
        ):
            raise SpecError(f"hybrid_layer_pattern must list 0 (full) or 1 (sliding) for each of {n} layers")
        sliding = [p == 1 for p in pattern[:n]]
    else:
        sliding = [not (i == 0 or (i + 1) % 6 == 0) for i in range(n)]
    if config.get("sliding_window_size") is not None:
        window = int(config["sliding_window_size"]) + 1
    else:
        window = int(config.get("sliding_window") or 129)  # the class default
    heads, k_dim = int(need(config, "num_key_value_heads")), int(need(config, "head_dim"))
    v_dim = int(config.get("v_head_dim") or k_dim)
    full = kv_row(heads, k_dim, v_dim, ctx)
    swa = kv_row(
        int(config.get("swa_num_key_value_heads") or 2 * heads),
        int(config.get("swa_head_dim") or k_dim),
        int(config.get("swa_v_head_dim") or v_dim),
        ctx,
    )
    out = []
    for i, s in enumerate(sliding):
        if not s or (ctx.max_seq_len is not None and window >= ctx.max_seq_len):
            out.append(LayerCache("full", "full", i, swa if s else full))
        else:
            out.append(LayerCache("sliding", "sliding", i, swa, window=window))
    return out


def _attention_block(config: Config, i: int) -> dict[str, Any]:
    blocks = need(config, "block_configs")
    if not isinstance(blocks, list) or i >= len(blocks) or not isinstance(blocks[i], dict):
        raise SpecError(f"block_configs must hold one object per layer; layer {i} has none")
    attention = blocks[i].get("attention")
    if not isinstance(attention, dict):
        raise SpecError(f"block_configs[{i}].attention must be an object")
    return attention


def nemotron_nas(config: Config, ctx: Context) -> list[LayerCache]:
    """Llama-Nemotron (Super/Ultra) NAS models: per layer, `block_configs[i].attention`
    is `no_op` (no attention), `replace_with_linear` (a linear map, no cache), or
    GQA with num_attention_heads / n_heads_in_group KV heads of hidden_size /
    num_attention_heads (vLLM's DeciLM reading). Windowed or sparsified blocks
    are refused by name: kvpool does not model them."""
    n = int(need(config, "num_hidden_layers"))
    q_heads = int(need(config, "num_attention_heads"))
    dim = int(config.get("head_dim") or int(need(config, "hidden_size")) // q_heads)
    out = []
    for i in range(n):
        block = _attention_block(config, i)
        if block.get("no_op") or block.get("replace_with_linear"):
            continue
        group = _heads_in_group(block, i, q_heads)
        out.append(LayerCache("full", "full", i, kv_row(q_heads // group, dim, dim, ctx)))
    return out


def _heads_in_group(block: Mapping[str, Any], i: int, q_heads: int) -> int:
    """`n_heads_in_group` of attention block `i`, a positive divisor of the query
    heads; a windowed or sparsified block refused by name."""
    for field in ("window_length", "sparsify", "num_sink_tokens"):
        if block.get(field):
            raise SpecError(f"block_configs[{i}].attention.{field} is set, which kvpool cannot model")
    group = block.get("n_heads_in_group")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or q_heads % group:
        raise SpecError(
            f"block_configs[{i}].attention.n_heads_in_group must be a positive divisor of "
            f"num_attention_heads ({q_heads}), got {group!r}"
        )
    return group
