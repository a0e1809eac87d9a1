"""Managers with cold tiers and a `TierCopies` that moves labels, for the tier
tests (tests/test_cache_tiers.py, tests/test_cache_tier_failures.py)."""

from __future__ import annotations

from typing import Any

from kvpool.cache import KVCacheManager
from kvpool.cache.tiers import TierSpec
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import ModelSpec

TPB = 4


def tiered(spec: ModelSpec, pages: dict[str, int], host_pages: int, disk_pages: int = 0, **kw: Any) -> KVCacheManager:
    """A manager whose host (and disk) tier holds `host_pages` (`disk_pages`)
    pages of the group with the most GPU pages, the others in proportion."""
    plan = PoolPlan.from_pages(spec, pages, ServingLimits(max_batch_size=8, max_seq_len=4096))
    top = max(pages, key=lambda g: pages[g])
    page_bytes = plan.group(top).page_bytes
    gpu_bytes = sum(plan.group(g).bytes for g in pages)
    per_page = gpu_bytes // pages[top]  # bytes of the whole plan per page of the top group
    tiers = [TierSpec("CPU", host_pages * per_page)]
    if disk_pages:
        tiers.append(TierSpec("DISK", disk_pages * per_page))
    assert page_bytes > 0
    return KVCacheManager(plan, tiers=tiers, state_snapshots=True, **kw)


class Labels:
    """A `TierCopies` that moves labels instead of bytes: what each GPU page
    and tier slot holds, so a test can check every copy the manager asks for."""

    def __init__(self) -> None:
        self.gpu: dict[tuple[int, int], int] = {}
        self.tier: dict[tuple[int, str, int], int] = {}

    def to_tier(self, group: int, page: int, medium: str, slot: int) -> None:
        self.tier[group, medium, slot] = self.gpu[group, page]

    def to_gpu(self, group: int, medium: str, slot: int, page: int) -> None:
        self.gpu[group, page] = self.tier[group, medium, slot]

    def between(self, group: int, src: str, src_slot: int, dst: str, dst_slot: int) -> None:
        self.tier[group, dst, dst_slot] = self.tier[group, src, src_slot]
