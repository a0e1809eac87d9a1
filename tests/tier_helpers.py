"""Managers with cold tiers and a `TierCopies` that moves labels (and one that
fails), for the tier tests (tests/test_cache_tiers.py,
tests/test_cache_tier_failures.py, the soak run tests/test_cache_soak_tier_failures.py)."""

from __future__ import annotations

import random
from collections.abc import Set as AbstractSet
from typing import Any

from cache_helpers import snapshot
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


POISON = -1


class DmaFailed(RuntimeError):
    pass


class Flaky(Labels):
    """Labels that fail the copies in `fail`, (method, its n-th call from 0), or
    each with probability `fail`, after writing POISON over the destination."""

    def __init__(self, fail: AbstractSet[tuple[str, int]] | float = frozenset(), seed: int = 0) -> None:
        super().__init__()
        self.fail, self.rng = fail, random.Random(seed)
        self.calls = {"to_tier": 0, "to_gpu": 0, "between": 0}
        self.failed = 0

    def _failing(self, method: str) -> bool:
        n = self.calls[method]
        self.calls[method] += 1
        fails = self.rng.random() < self.fail if isinstance(self.fail, float) else (method, n) in self.fail
        self.failed += fails
        return fails

    def to_tier(self, group: int, page: int, medium: str, slot: int) -> None:
        if self._failing("to_tier"):
            self.tier[group, medium, slot] = POISON
            raise DmaFailed("to_tier")
        super().to_tier(group, page, medium, slot)

    def to_gpu(self, group: int, medium: str, slot: int, page: int) -> None:
        if self._failing("to_gpu"):
            self.gpu[group, page] = POISON
            raise DmaFailed("to_gpu")
        super().to_gpu(group, medium, slot, page)

    def between(self, group: int, src: str, src_slot: int, dst: str, dst_slot: int) -> None:
        if self._failing("between"):
            self.tier[group, dst, dst_slot] = POISON
            raise DmaFailed("between")
        super().between(group, src, src_slot, dst, dst_slot)


def books(m: KVCacheManager) -> dict[str, Any]:
    """`snapshot` plus every tier level's held digests (LRU order), free slots and pins, and the suspensions."""
    out = snapshot(m)
    assert m.tier is not None
    out["tiers"] = [
        ([list(h.items()) for h in t.held], [list(f) for f in t.free], list(t.pinned)) for t in m.tier.levels()
    ]
    out["suspended"] = {rid: m.suspension(rid) for rid, _ in m.iter_requests()}
    return out


def requests_and_pins(m: KVCacheManager) -> dict[str, Any]:
    """What a caller relies on after a failed call: each request's shape and
    pages, and which slots are pinned and by whom."""
    b = books(m)
    shapes = {k: v for k, v in b["observed"].items() if k.startswith("r")}
    owners = {p.name: list(p.ref) for p in m.pools}
    return {"shapes": shapes, "owners": owners, "pins": [t[2] for t in b["tiers"]], "suspended": b["suspended"]}


def assert_every_label_true(m: KVCacheManager, labels: Labels) -> None:
    """Every cached GPU page and every held slot holds what its digest says."""
    for gi, pool in enumerate(m.pools):
        for digest, page in pool.cached.items():
            if pool.ref[page] == 0:
                assert labels.gpu.get((gi, page)) == digest, (gi, page, digest)
    assert m.tier is not None
    for level in m.tier.levels():
        for gi, held in enumerate(level.held):
            for digest, slot in held.items():
                assert labels.tier.get((gi, level.medium, slot)) == digest, (level.medium, gi, slot, digest)


def computed(m: KVCacheManager, labels: Labels, rid: int, hit: int) -> None:
    """The engine writes the pages it computed (past the hit): a whole page's
    label is its digest, a partial page's its request and block."""
    for gi, group in enumerate(m.groups):
        pool = m.pools[gi]
        for block, page in enumerate(m.block_table(rid, group.name).tolist()):
            if page >= 0 and (block + 1) * TPB > hit:
                digest = pool.page_hash[page]
                labels.gpu[gi, page] = digest if digest is not None else hash(("partial", rid, block))
