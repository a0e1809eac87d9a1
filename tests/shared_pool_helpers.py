"""Factories for the shared-pool tests: a model whose full and sliding layers
have equal page bytes, and managers whose groups draw from one pool."""

from __future__ import annotations

from typing import Any

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import ModelSpec, load_model_spec

POOL = "shared"


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


def shared_manager(spec: ModelSpec, pages: int, *, reuse: bool = True, **limits: Any) -> KVCacheManager:
    """A manager whose groups all draw from one pool `shared` of `pages` pages."""
    limits.setdefault("max_batch_size", 8)
    limits.setdefault("max_seq_len", 4096)
    plan = PoolPlan.from_shared_pool(spec, pages, ServingLimits(**limits), name=POOL)
    return KVCacheManager(plan, enable_reuse=reuse)
