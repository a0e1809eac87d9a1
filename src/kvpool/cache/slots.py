"""`SlotTables`: every request's page tables and shape, in NumPy arrays by slot.

A request is a (capacity, history) pair (docs/design.md, vocabulary). Its page table in a group has
one entry per page-sized block of positions; blocks that left a window or a finished chunk hold `STALE`.
Every page count comes from `kvpool.spec.pages`: a move to a new shape asks `pages_needed` and
`stale_pages` for the target and takes the table there, all groups or none (rule 6; groups that share
one pool, `cache.shared_pool`, are summed).

For each group and slot the arrays also keep the capacities `(cap_lo, cap_hi]` and the history
`stale_next` within which the table stays as it is, so a batched step finds with three vector
comparisons the requests that cross a page boundary and plans only those, with the same planner a
single resize uses (`plan_change`). A single resize works on the request's mirror of those numbers
(`cache/shapes.py`): plain ints, so only the page ids it changes touch NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvpool.cache.pool import PagePool
from kvpool.cache.request import Request
from kvpool.cache.results import RESIZED, Resize
from kvpool.cache.shapes import ShapeArrays
from kvpool.cache.shared_pool import is_shared, shared_shortfall
from kvpool.spec.groups import LayerGroup
from kvpool.spec.pages import pages_needed, stale_pages

STALE = -1  # block-table entry of a block that has no page (stale or never needed)


@dataclass(slots=True)
class _Change:
    """How one request's table in one group moves (planned, not yet applied)."""

    slot: int
    nblk: int
    nstale: int
    first_new: int
    new: int
    release: list[int]
    old_nstale: int
    old_nblk: int
    hist: int


class SlotTables(ShapeArrays):
    """Shapes and page tables of up to `len(cap)` requests (grows on demand).
    Methods that return a `Resize` change nothing when it is falsy."""

    def __init__(self, groups: Sequence[LayerGroup], pools: list[PagePool], slots: int, longest: int) -> None:
        super().__init__(groups, slots)
        self.pools, self.shared = pools, is_shared(pools)  # shared: groups drawing from one pool
        # wide enough for `longest` positions (at most 1024 blocks; `widen` doubles)
        self.tables = [np.full((slots, min(1024, pages_needed(g, longest) + 1)), STALE, np.int32) for g in groups]
        self.free_slots = list(range(slots - 1, -1, -1))

    # ------------------------------------------------------------------ slots

    def acquire(self) -> int:
        """A fresh slot (give it a shape with `start`)."""
        if not self.free_slots:
            self.grow()
        return self.free_slots.pop()

    def start(self, req: Request, limit: int) -> None:
        """`req` (in a fresh slot) has capacity 0 and no pages, in its mirror."""
        n = len(self.groups)
        req.cap = req.hist = 0
        req.nblks, req.nstales = [0] * n, [0] * n
        req.nxts = [self.next_stale(gi, 0) for gi in range(n)]
        req.limit = limit
        req.hi = 0  # mirrored
        self.mirrored[req.slot] = req
        self.rebound(req)

    def release(self, req: Request) -> None:
        """Drop every page of `req` (walking each table backwards, so that the
        tail is evicted before a shared prefix) and return its slot. The
        slot's numbers are left as they are: `start` sets them anew."""
        slot = req.slot
        nblks, nstales = self.counts(req)
        if self.mirrored.pop(slot, None) is not None:
            req.hi = -1
        for gi, nblk in enumerate(nblks):
            if nblk:
                row = self.tables[gi][slot]
                pages = row[nstales[gi] : nblk].tolist()
                pages.reverse()
                self.pools[gi].release(pages)
                row[:nblk] = STALE
        self.free_slots.append(slot)

    def live(self, gi: int, req: Request) -> int:
        """Pages `req` holds in group `gi`."""
        nblks, nstales = self.counts(req)
        return nblks[gi] - nstales[gi]

    # ------------------------------------------------------------------ moving shapes

    def plan_one(self, req: Request, cap: int, hist: int) -> tuple[list[tuple[int, _Change]], dict[str, int]]:
        """`apply`'s plan for one mirrored request (validated shape): the
        changes per group, and the pages short per group (empty: it fits)."""
        slot, nblks, nstales = req.slot, req.nblks, req.nstales
        plans: list[tuple[int, _Change]] = []
        short: dict[str, int] = {}
        for gi, pool in enumerate(self.pools):
            ch = self.plan_change(gi, slot, cap, hist, nblks[gi], nstales[gi])
            if ch is None:
                continue
            if ch.new and ch.new > len(pool.free_stack) + pool.lru_len:
                missing = ch.new - pool.num_free - _freed(pool, ch.release)
                if missing > 0:
                    short[pool.name] = missing
            plans.append((gi, ch))
        if self.shared:  # groups of one pool are summed (rule 6 across groups)
            grouped: list[list[_Change]] = [[] for _ in self.pools]
            for gi, ch in plans:
                grouped[gi].append(ch)
            short = shared_shortfall(self.pools, grouped, short)
        return plans, short

    def apply_one(self, req: Request, plans: list[tuple[int, _Change]], cap: int, hist: int) -> None:
        """Carry out `plan_one`'s plan that fits: releases first, then the new
        pages, into the tables and the request's mirror."""
        slot = req.slot
        for gi, ch in plans:
            if ch.release:
                self.unlink(gi, ch)
        for gi, ch in plans:
            if ch.new:
                table, pool = self.tables[gi], self.pools[gi]
                if ch.nblk > table.shape[1]:
                    table = self.widen(gi, ch.nblk)
                if ch.new == 1:
                    table[slot, ch.first_new] = pool.take(1)[0]
                else:
                    table[slot, ch.first_new : ch.nblk] = pool.take(ch.new)
            req.nblks[gi] = ch.nblk
            if ch.nstale != ch.old_nstale:
                req.nstales[gi] = ch.nstale
                req.nxts[gi] = self.next_stale(gi, hist)
        req.cap, req.hist = cap, hist
        if plans:
            self.rebound(req)

    def plan_change(self, gi: int, slot: int, cap: int, hist: int, nblk: int, nstale: int) -> _Change | None:
        """How `slot`'s table in group `gi` moves from `nblk` blocks (`nstale`
        stale) to shape (cap, hist), by `pages_needed`/`stale_pages`; None if it stays."""
        g = self.groups[gi]
        stale = stale_pages(g, hist)
        total = pages_needed(g, cap, hist) + stale
        if total == nblk and stale == nstale:
            return None
        table = self.tables[gi]
        release = table[slot, nstale : min(stale, nblk)].tolist() if stale > nstale else []
        if total < nblk:
            release += table[slot, total:nblk].tolist()
        first_new = max(nblk, stale)
        new = total - first_new if total > first_new else 0
        return _Change(slot, total, stale, first_new, new, release, nstale, nblk, hist)

    def unlink(self, gi: int, ch: _Change) -> None:
        """Take a planned change's released pages out of its table and release them."""
        table = self.tables[gi]
        if ch.nstale > ch.old_nstale:
            table[ch.slot, ch.old_nstale : min(ch.nstale, ch.old_nblk)] = STALE
        if ch.nblk < ch.old_nblk:
            table[ch.slot, ch.nblk : ch.old_nblk] = STALE
        self.pools[gi].release(ch.release)

    def apply(
        self,
        slots: list[int],
        caps: list[int],
        hists: list[int],
        mask: list[list[bool]] | None = None,
        *,
        dry_run: bool = False,
    ) -> Resize:
        """Move the tables of each (slot, capacity, history) in every group (or
        only where `mask[group][i]`): plan with `pages_needed`/`stale_pages`;
        if every group has the pages, apply (all releases first, then the
        allocations); else change nothing and say which groups lacked pages.
        Does not write `cap`/`hist` (the callers do). `dry_run`: only answer.
        Mirrored requests among `slots` are unmirrored first (it works on the arrays)."""
        if self.mirrored:
            self.unmirror_slots(slots)
        if len(slots) == 1:  # a view and a flat list: cheaper than fancy indexing
            old_nblk = [[n] for n in self.nblk_data[:, slots[0]].tolist()]
            old_nstale = [[n] for n in self.nstale_data[:, slots[0]].tolist()]
        else:
            old_nblk = self.nblk_data[:, slots].tolist()
            old_nstale = self.nstale_data[:, slots].tolist()
        plans: list[list[_Change]] = []
        short = {}
        for gi, pool in enumerate(self.pools):
            row_mask = mask[gi] if mask else None
            nblks, nstales = old_nblk[gi], old_nstale[gi]
            changes: list[_Change] = []
            need = 0
            released: list[int] = []
            for j, slot in enumerate(slots):
                if row_mask is not None and not row_mask[j]:
                    continue
                ch = self.plan_change(gi, slot, caps[j], hists[j], nblks[j], nstales[j])
                if ch is not None:
                    need += ch.new
                    released += ch.release
                    changes.append(ch)
            if need > pool.num_free:
                missing = need - pool.num_free - _freed(pool, released)
                if missing > 0:
                    short[pool.name] = missing
            plans.append(changes)
        short = shared_shortfall(self.pools, plans, short) if self.shared else short  # summed per shared pool
        if short:
            return Resize(short)
        if dry_run:
            return RESIZED
        for gi, changes in enumerate(plans):
            for ch in changes:
                if ch.release:
                    self.unlink(gi, ch)
        for gi, changes in enumerate(plans):
            if changes:
                self._allocate(gi, changes)
        return RESIZED

    def _allocate(self, gi: int, changes: list[_Change]) -> None:
        """Apply planned changes of one group after the releases: new pages
        into the tables, block counts and thresholds."""
        table, pool = self.tables[gi], self.pools[gi]
        width = max(ch.nblk for ch in changes)
        if width > table.shape[1]:
            table = self.widen(gi, width)
        rows, cols = [], []
        for ch in changes:
            if ch.new == 1:  # the common decode case: one fancy assignment for all
                rows.append(ch.slot)
                cols.append(ch.first_new)
            elif ch.new:
                table[ch.slot, ch.first_new : ch.nblk] = pool.take(ch.new)
        if len(rows) == 1:
            table[rows[0], cols[0]] = pool.take(1)[0]
        elif rows:
            table[rows, cols] = pool.take(len(rows))
        self.set_blocks(gi, [ch.slot for ch in changes], [ch.nblk for ch in changes], [ch.nstale for ch in changes])
        for ch in changes:
            if ch.nstale != ch.old_nstale:
                self.thr_data[2, gi, ch.slot] = self.next_stale(gi, ch.hist)

    # ------------------------------------------------------------------ storage

    def grow(self) -> None:
        """Double the slot arrays (more live requests than planned for)."""
        old = self.cap_data.shape[0]
        self.grow_shapes(old)
        self.tables = [np.concatenate([t, np.full_like(t, STALE)]) for t in self.tables]
        self.free_slots = list(range(2 * old - 1, old - 1, -1)) + self.free_slots

    def widen(self, gi: int, width: int) -> npt.NDArray[np.int32]:
        """Make group `gi`'s tables at least `width` blocks wide (doubling)."""
        t = self.tables[gi]
        wide = np.full((t.shape[0], max(width, 2 * t.shape[1])), STALE, np.int32)
        wide[:, : t.shape[1]] = t
        self.tables[gi] = wide
        return wide


def _freed(pool: PagePool, pages: list[int]) -> int:
    """How many of `pages` (one entry per owner released) end unowned."""
    count: dict[int, int] = {}
    for p in pages:
        count[p] = count.get(p, 0) + 1
    return sum(1 for p, c in count.items() if pool.ref[p] == c)
