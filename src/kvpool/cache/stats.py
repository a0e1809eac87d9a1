"""`KVCacheManager.stats`: pages per group and the cumulative reuse counters,
read off the pools, the request registry and the cold tiers (changes nothing)."""

from __future__ import annotations

from collections.abc import Sequence, Set

from kvpool.cache.events import CacheStats, GroupStats
from kvpool.cache.pool import PagePool
from kvpool.cache.request import Requests
from kvpool.cache.tiers import ColdTier


def cache_stats(
    pools: Sequence[PagePool],
    requests: Requests,
    padding: Set[int],
    queried: int,
    hit: int,
    tier: ColdTier | None,
) -> CacheStats:
    """Pages per group (total, free, used, cached, dummy, reserved: those of the
    `padding` dummies) and the reuse counters (`queried`, `hit` tokens); groups
    that share a pool report its total, free, used and cached pages. With cold
    tiers, the offloads whose copy failed (`TierCopies`) too."""
    groups = {}
    for gi, pool in enumerate(pools):
        groups[pool.name] = GroupStats(
            total=pool.num_pages,
            free=pool.num_free,
            used=pool.num_pages - pool.num_free,
            cached=pool.num_cached,
            dummy=sum(r.live(gi) for r in requests if r.dummy and r.rid not in padding),
            reserved=sum(requests.get(r).live(gi) for r in padding),
        )
    dummy_count = sum(1 for r in requests if r.dummy)
    stats = CacheStats(groups, queried, hit, len(requests) - dummy_count, dummy_count)
    if tier is not None:  # offloads whose copy failed (`TierCopies`)
        stats.extra["failed_tier_copies"] = sum(t.failed_copies for t in tier.levels())
    return stats
