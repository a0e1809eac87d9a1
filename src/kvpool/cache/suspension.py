"""Suspending a request: its live pages leave the GPU for a cold tier and come
back on resume (TensorRT-LLM V2's `suspend()` / `resume()`; docs/cache.md).

The functions take the page tables, the request record and the cold tiers
(through `cache/cold.py`'s interface), never the manager; they change nothing
when they refuse. `Suspended` keeps each suspended request's `Suspension` and
moves the request between the registry's GPU and suspended records with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpool.cache.cold import ColdStore
from kvpool.cache.events import CacheUsageError
from kvpool.cache.request import Request, Requests
from kvpool.cache.results import RESIZED, Resize
from kvpool.cache.tables import PageTables
from kvpool.media import Medium


@dataclass(frozen=True)
class Suspension:
    """Where a suspended request's pages went: `medium`, and per group the GPU
    pages it held (`pages`) and the tier slots that now hold them (`slots`),
    in the same order; the engine copies `pages[g][i]` to `slots[g][i]`."""

    medium: Medium
    pages: tuple[tuple[int, ...], ...]
    slots: tuple[tuple[int, ...], ...]


def suspend(t: PageTables, req: Request, tier: ColdStore) -> Suspension | dict[str, int]:
    """Park `req`'s live pages in the warmest cold tier with room for all of them
    (`ColdStore.park`: copied there) and release its GPU pages (its counts stay);
    else the slots missing per group in the coldest tier, nothing changed. A copy
    that raises leaves the request on the GPU (the room made for it stays made:
    those pages moved one tier down)."""
    pages = t.live_pages(req)
    parked = tier.park(pages)  # before the pages are released: nothing can take them
    if parked is not None:
        t.drop_pages(req)
        medium, slots = parked
        return Suspension(medium, tuple(map(tuple, pages)), tuple(map(tuple, slots)))
    short = tier.missing([len(group_pages) for group_pages in pages])
    return {g.name: n for g, n in zip(t.groups, short, strict=True) if n > 0}


def resume_shortfall(t: PageTables, req: Request, max_util: float) -> dict[str, int]:
    """Pages missing per group to bring suspended `req` back, by TensorRT-LLM V2's
    rule (`_KVCache.resume`: refused when the most used pool group is *already*
    above `max_util_for_resume`, keeping room for the running requests to grow):
    a pool of growing pages used beyond `max_util` of its pages now is short of
    what it must free to get back under it; any pool is short of the free pages
    the request's pages need. A pool of state slots alone never refuses on
    utilization (one slot per request; it does not grow: V2's
    `poolGroupNeedsHeadroomForGrowth`)."""
    short = {}
    for gi, pool in enumerate(t.pools):
        used = pool.num_pages - pool.num_free
        over = used - math.floor(max_util * pool.num_pages) if used > max_util * pool.num_pages else 0
        grows = not t.groups[gi].rule.per_request
        missing = max(over if grows else 0, req.live(gi) - pool.num_free)
        if missing > 0:
            short[pool.name] = missing
    return short


def resume(t: PageTables, req: Request, suspension: Suspension, tier: ColdStore) -> None:
    """Bring `req`'s pages back into fresh GPU pages (`resume_shortfall` was
    empty) and unpin its slots. A copy that raises gives the fresh pages back and
    leaves the request suspended (cached pages evicted for room stay evicted)."""
    pages = t.take_pages(req)
    try:
        tier.fetch(suspension.medium, suspension.slots, pages)
    except BaseException:
        t.give_back(pages)
        raise
    t.fill_rows(req, pages)
    tier.unpark(suspension.medium, suspension.slots)


def release(parked: Suspension, tier: ColdStore) -> None:
    """Unpin a suspended request's slots (it is being freed)."""
    tier.unpark(parked.medium, parked.slots)


class Suspended:
    """Request id -> `Suspension` of each suspended request (its record is
    among the registry's `suspended` ones exactly while it is here)."""

    def __init__(self) -> None:
        self.by_id: dict[int, Suspension] = {}

    def suspend(self, t: PageTables, registry: Requests, req: Request, tier: ColdStore) -> Resize:
        """`suspend` registered `req` (no dummy); falsy, nothing changed, with
        the slots short per group."""
        done = suspend(t, req, tier)  # a copy that raises leaves it on the GPU
        if not isinstance(done, Suspension):
            return Resize(done)
        self.by_id[req.rid] = done
        registry.suspend(req.rid)
        return RESIZED

    def resume(self, t: PageTables, registry: Requests, rid: int, tier: ColdStore | None, max_util: float) -> Resize:
        """`resume` `rid` unless `resume_shortfall` names pages (falsy, nothing
        changed); CacheUsageError when it is not suspended."""
        parked = self.by_id.get(registry.record(rid).rid)
        if parked is None or tier is None:
            raise CacheUsageError(f"request {rid!r} is not suspended")
        req = registry.suspended[rid]
        short = resume_shortfall(t, req, max_util)
        if short:
            return Resize(short)
        resume(t, req, parked, tier)  # a copy that raises leaves it suspended
        del self.by_id[rid]
        registry.resume(rid)
        return RESIZED
