"""Factories and assertion helpers shared by the cache tests (plus checks of the
factories themselves)."""

from __future__ import annotations

from typing import Any

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import ModelSpec, load_model_spec


def full_spec(tpb: int = 16) -> ModelSpec:
    """Two full-attention layers (one pool group `full`)."""
    return load_model_spec(
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 128,
            "max_position_embeddings": 1 << 20,
            "torch_dtype": "bfloat16",
        },
        tokens_per_block=tpb,
    )


def hybrid_spec(tpb: int = 16, window: int = 40) -> ModelSpec:
    """Qwen3-Next-like: groups `full`, `sliding` (window W) and `linear_state`."""
    return load_model_spec(
        {
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 128,
            "max_position_embeddings": 1 << 20,
            "torch_dtype": "bfloat16",
            "layer_types": ["full_attention", "sliding_attention", "linear_attention"],
            "sliding_window": window,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 4,
        },
        tokens_per_block=tpb,
    )


def manager(
    spec: ModelSpec,
    pages: dict[str, int],
    *,
    reuse: bool = True,
    snapshots: bool = True,
    events: bool = True,
    **limits: Any,
) -> KVCacheManager:
    """A manager over hand-sized pools (every group of `spec` must be named);
    state snapshots on unless `snapshots=False`."""
    limits.setdefault("max_batch_size", 8)
    limits.setdefault("max_seq_len", 4096)
    return KVCacheManager(
        PoolPlan.from_pages(spec, pages, ServingLimits(**limits)),
        enable_reuse=reuse,
        state_snapshots=snapshots,
        events=events,
    )


def snapshot(m: KVCacheManager) -> dict[str, Any]:
    """Everything observable about a manager, to compare before/after a refused
    call: `observed` plus the lookup counters and the event records. Not
    `stats()`: it writes every mirror back, which would close the fast paths
    the refused call should be tried on."""
    counters = (m.reuse_queried_tokens, m.reuse_hit_tokens)
    return {"observed": observed(m), "counters": counters, "events": list(m.events)}


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in before:
        assert before[key] == after[key], f"{key} changed:\nbefore {before[key]}\nafter  {after[key]}"


def assert_table(m: KVCacheManager, rid: int, group: str, expected: list[int]) -> None:
    got = m.block_table(rid, group).tolist()
    assert got == expected, f"request {rid} group {group}: table {got}, expected {expected}"


def twin_spec(tpb: int = 16, window: int = 40) -> ModelSpec:
    """One full and one sliding(W) layer of 2 KV heads x 32 dims in bf16:
    2 x 2 x 32 x 2 = 256 bytes per position per layer, so both groups' pages
    are 256 x tpb bytes (equal, as a shared pool needs)."""
    return load_model_spec(
        {
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 128,
            "max_position_embeddings": 1 << 20,
            "torch_dtype": "bfloat16",
            "layer_types": ["full_attention", "sliding_attention"],
            "sliding_window": window,
        },
        tokens_per_block=tpb,
    )


def observed(m: KVCacheManager) -> dict[str, Any]:
    """Shapes, tables and pools (owners, hashes, free stack, LRU order)."""
    out: dict[str, Any] = {}
    for rid, _ in m.iter_requests():
        out[f"r{rid}"] = (m.capacity(rid), m.history(rid), [m.block_table(rid, g.name).tolist() for g in m.groups])
    for p in m.pools:
        out[p.name] = (list(p.ref), list(p.page_hash), list(p.free_stack), p.lru_order())
    return out
