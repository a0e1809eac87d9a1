"""cache: the run-time page manager (pure Python + NumPy, no GPU).

`KVCacheManager(plan)` owns one page pool per group of a `PoolPlan` and keeps,
for each request, which pages hold its positions (`block_table`). Every page
count comes from `kvpool.spec.pages` (docs/design.md, rule 1).
"""

from kvpool.cache.events import (
    CacheEvent,
    CacheIntegrityError,
    CacheStats,
    CacheUsageError,
    GroupStats,
)
from kvpool.cache.manager import STALE, KVCacheManager
from kvpool.cache.request import Request
from kvpool.cache.results import Dummies, Resize
from kvpool.cache.suspension import Suspension
from kvpool.cache.tiers import TierSpec
from kvpool.plan.capture import SkippedShape, WarmupReport

__all__ = [
    "STALE",
    "CacheEvent",
    "CacheIntegrityError",
    "CacheStats",
    "CacheUsageError",
    "Dummies",
    "GroupStats",
    "KVCacheManager",
    "Request",
    "Resize",
    "SkippedShape",
    "Suspension",
    "TierSpec",
    "WarmupReport",
]
