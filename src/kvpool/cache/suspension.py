"""Suspending a request: its live pages leave the GPU for a cold tier and come
back on resume (TensorRT-LLM V2's `suspend()` / `resume()`; docs/cache.md).

The functions take the page tables, the request record and the tiers, never
the manager; they change nothing when they refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpool.cache.request import Request
from kvpool.cache.tables import PageTables
from kvpool.cache.tiers import ColdTier, Medium


@dataclass(frozen=True)
class Suspension:
    """Where a suspended request's pages went: `medium`, and per group the GPU
    pages it held (`pages`) and the tier slots that now hold them (`slots`),
    in the same order; the engine copies `pages[g][i]` to `slots[g][i]`."""

    medium: Medium
    pages: tuple[tuple[int, ...], ...]
    slots: tuple[tuple[int, ...], ...]


def suspend(t: PageTables, req: Request, tier: ColdTier) -> Suspension | dict[str, int]:
    """Pin `req`'s live pages in the warmest of `tier` and the tiers below it
    with room for all of them, copy them there and release its GPU pages (its
    counts stay); else the slots missing per group in the coldest tier, nothing
    changed. A copy that raises unpins the slots and leaves the request on the
    GPU (the room made for them stays made: those pages moved one tier down)."""
    counts = [req.live(gi) for gi in range(len(t.groups))]
    for level in tier.levels():
        slots = level.pin(counts)
        if slots is not None:
            pages = t.live_pages(req)
            if level.copies is not None:  # before the pages are released: nothing can take them
                try:
                    for gi, (group_pages, group_slots) in enumerate(zip(pages, slots, strict=True)):
                        for page, slot in zip(group_pages, group_slots, strict=True):
                            level.copies.to_tier(gi, page, level.medium, slot)
                except BaseException:
                    level.unpin(slots)
                    raise
            t.drop_pages(req)
            return Suspension(level.medium, tuple(map(tuple, pages)), tuple(map(tuple, slots)))
    coldest = tier.levels()[-1]
    short = {
        g.name: n - len(coldest.free[gi]) - len(coldest.held[gi])
        for gi, (g, n) in enumerate(zip(t.groups, counts, strict=True))
    }
    return {name: n for name, n in short.items() if n > 0}


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


def resume(t: PageTables, req: Request, suspension: Suspension, tier: ColdTier) -> None:
    """Bring `req`'s pages back into fresh GPU pages (`resume_shortfall` was
    empty) and unpin its slots. A copy that raises gives the fresh pages back and
    leaves the request suspended (cached pages evicted for room stay evicted)."""
    level = next(x for x in tier.levels() if x.medium == suspension.medium)
    pages = t.take_pages(req)
    if level.copies is not None:
        try:
            for gi, (group_slots, group_pages) in enumerate(zip(suspension.slots, pages, strict=True)):
                for slot, page in zip(group_slots, group_pages, strict=True):
                    level.copies.to_gpu(gi, level.medium, slot, page)
        except BaseException:
            t.give_back(pages)
            raise
    t.fill_rows(req, pages)
    level.unpin(suspension.slots)


def release(req_slots: Suspension, tier: ColdTier) -> None:
    """Unpin a suspended request's slots (it is being freed)."""
    level = next(x for x in tier.levels() if x.medium == req_slots.medium)
    level.unpin(req_slots.slots)
