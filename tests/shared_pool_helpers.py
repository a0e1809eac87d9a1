"""Factories for the shared-pool tests: a model whose full and sliding layers
have equal page bytes, and managers whose groups draw from one pool."""

from __future__ import annotations

from typing import Any

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import ModelSpec

POOL = "shared"


def shared_manager(spec: ModelSpec, pages: int, *, reuse: bool = True, **limits: Any) -> KVCacheManager:
    """A manager whose groups all draw from one pool `shared` of `pages` pages."""
    limits.setdefault("max_batch_size", 8)
    limits.setdefault("max_seq_len", 4096)
    plan = PoolPlan.from_shared_pool(spec, pages, ServingLimits(**limits), name=POOL)
    return KVCacheManager(plan, enable_reuse=reuse)
