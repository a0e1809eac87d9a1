"""Undoing a prefix hit whose copy failed: an engine's `TierCopies.to_gpu` that
raises (a DMA that failed) while `create` copies a hit in from a cold tier
leaves the books as they were before the call, and the exception goes on to
the caller. (Suspend and resume undo their own copies: cache/suspension.py.)

`Books` saves what the hit may change (every GPU pool, every cold tier, the
request's rows, the event records) and puts it back in place, so that the lists
the hot paths hold stay the same objects. One thing cannot come back: content a
copy of the call wrote over. A page or slot that held a digest before the call
and was a copy's destination during it (an eviction made room there) is freed
after the restore, its digest dropped and recorded `removed`: a hit on it would
read what the cut-short copy left. Where the call evicted nothing, the books
equal the snapshot exactly.

It costs a copy of the pools' and tiers' lists, so the manager takes it only
when an engine's copies are set and the hit needs a page from a cold tier.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvpool.cache import prefix
from kvpool.cache.events import EventRecord
from kvpool.cache.pool import PagePool
from kvpool.cache.prompt_memo import PromptMemo
from kvpool.cache.request import Request
from kvpool.cache.tables import STALE, PageTables
from kvpool.cache.tiers import ColdTier, TierCopies
from kvpool.media import Medium

_POOL_LISTS = ("ref", "page_hash", "free_stack", "prev", "nxt")
# a copy's destination: (group, None, GPU page) or (group, tier medium, slot)
Destination = tuple[int, Medium | None, int]


class Books:
    """The state of `tables`' pools, `tier` and its levels below, `req`'s rows
    and `events`, as they are now; `restore` puts it back. While it is `watching`,
    the destination of every copy the engine is asked for is noted."""

    def __init__(self, tables: PageTables, tier: ColdTier | None, req: Request, events: deque[EventRecord]) -> None:
        self.tables, self.tier, self.req, self.events = tables, tier, req, events
        self.pools = [_pool_state(p) for p in tables.pools]
        self.levels = [] if tier is None else [_tier_state(level) for level in tier.levels()]
        self.rows = [table[req.slot].copy() for table in tables.tables]
        self.records = list(events)
        self.written: list[Destination] = []

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Each level's copies note their destinations here for the block's length."""
        levels = [] if self.tier is None else self.tier.levels()
        engine = [level.copies for level in levels]
        for level, copies in zip(levels, engine, strict=True):
            if copies is not None:
                level.copies = _Noting(copies, self.written)
        try:
            yield
        finally:
            for level, copies in zip(levels, engine, strict=True):
                level.copies = copies

    def restore(self) -> None:
        """The books as saved, then every destination written since that held a
        digest then dropped (module docstring)."""
        for pool, state in zip(self.tables.pools, self.pools, strict=True):
            _restore_pool(pool, state)
        levels = [] if self.tier is None else self.tier.levels()
        for level, saved in zip(levels, self.levels, strict=True):
            _restore_tier(level, saved)

        for table, row in zip(self.tables.tables, self.rows, strict=True):  # a table may have widened since
            table[self.req.slot, : len(row)] = row
            table[self.req.slot, len(row) :] = STALE
        self.events.clear()
        self.events.extend(self.records)
        by_medium = {level.medium: level for level in levels}

        for gi, medium, where in dict.fromkeys(self.written):
            if medium is not None:
                by_medium[medium].drop_slot(gi, where)
            elif _cached(self.tables.pools[gi], where):
                self.tables.pools[gi].drop_cached(where)


class _Noting:
    """An engine's `TierCopies` that notes each destination before copying."""

    def __init__(self, copies: TierCopies, written: list[Destination]) -> None:
        self.copies, self.written = copies, written

    def to_tier(self, group: int, page: int, medium: Medium, slot: int) -> None:
        self.written.append((group, medium, slot))
        self.copies.to_tier(group, page, medium, slot)

    def to_gpu(self, group: int, medium: Medium, slot: int, page: int) -> None:
        self.written.append((group, None, page))
        self.copies.to_gpu(group, medium, slot, page)

    def between(self, group: int, src: Medium, src_slot: int, dst: Medium, dst_slot: int) -> None:
        self.written.append((group, dst, dst_slot))
        self.copies.between(group, src, src_slot, dst, dst_slot)


def _cached(pool: PagePool, page: int) -> bool:
    return pool.ref[page] == 0 and pool.page_hash[page] is not None


def _pool_state(pool: PagePool) -> tuple[list[list[Any]], dict[int, int], int, int]:
    return [list(getattr(pool, name)) for name in _POOL_LISTS], dict(pool.cached), pool.drops, pool.store.lru_len


def _tier_state(level: ColdTier) -> tuple[list[OrderedDict[int, int]], list[list[int]], list[int]]:
    return [OrderedDict(h) for h in level.held], [list(f) for f in level.free], list(level.pinned)


def _restore_pool(pool: PagePool, state: tuple[list[list[Any]], dict[int, int], int, int]) -> None:
    """Put `_pool_state`'s lists back into the same list objects the hot paths hold."""
    lists, cached, drops, lru_len = state
    for name, saved in zip(_POOL_LISTS, lists, strict=True):
        getattr(pool, name)[:] = saved
    pool.cached.clear()
    pool.cached.update(cached)
    pool.drops = drops
    pool.store.lru_len = lru_len


def _restore_tier(level: ColdTier, state: tuple[list[OrderedDict[int, int]], list[list[int]], list[int]]) -> None:
    """Put `_tier_state`'s maps and lists back into the tier's own objects."""
    held, free, pinned = state
    for gi, (h, f) in enumerate(zip(held, free, strict=True)):
        level.held[gi].clear()
        level.held[gi].update(h)
        level.free[gi][:] = f
    level.pinned[:] = pinned


def attach_prefix_or_undo(
    tables: PageTables, req: Request, memo: PromptMemo, tier: ColdTier | None, events: deque[EventRecord]
) -> int:
    """`prefix.attach_prefix` for fresh `req`; when a copy from a cold tier raises,
    the books as they were before it (`Books.restore`), `req`'s row given back to
    the free rows (the caller forgets the request), and the exception re-raised."""
    if tier is None:  # early return: no copy, so nothing to undo (and no books or exit stack per request)
        return prefix.attach_prefix(tables, req, memo)
    saved: list[Books] = []
    with contextlib.ExitStack() as watch:

        def save() -> None:  # called by the hit before anything changes, when a page comes from a tier
            saved.append(Books(tables, tier, req, events))
            watch.enter_context(saved[0].watching())

        try:
            return prefix.attach_prefix(tables, req, memo, tier, save)
        except BaseException:
            if saved:
                watch.close()
                saved[0].restore()
                tables.free_slots.append(req.slot)
            raise
