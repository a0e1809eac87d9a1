"""`SlotTables`: every request's page tables and shape, in NumPy arrays by slot.

A request is a (capacity, history) pair (docs/design.md, vocabulary). Its page table in a group has
one entry per page-sized block of positions; blocks that left a window or a finished chunk hold `STALE`.
Every page count comes from `kvpool.spec.pages`: a move to a new shape asks `pages_needed` and
`stale_pages` for the target and takes the table there, all groups or none (rule 6).

For each group and slot the arrays also keep the capacities `(cap_lo, cap_hi]` and the history
`stale_next` within which the table stays as it is, so a batched step finds with three vector
comparisons the requests that cross a page boundary and plans only those, with the same planner a
single resize uses. A single resize reads the same thresholds from the request's mirror
(`mirror`): plain ints, so a step that crosses no boundary touches no NumPy scalar.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvpool.cache.pool import PagePool
from kvpool.cache.results import RESIZED, Resize
from kvpool.cache.shapes import IntArray, ShapeArrays
from kvpool.spec.groups import LayerGroup
from kvpool.spec.kinds import NEVER  # threshold of a group that never goes stale
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
        self.groups = tuple(groups)
        self.pools = pools
        self.tokens_per_block = groups[0].tokens_per_block
        self.is_state = [g.rule.per_request for g in groups]
        self.never_stale = [stale_pages(g, NEVER) == 0 for g in groups]
        super().__init__(len(groups), slots)
        # wide enough for `longest` positions (at most 1024 blocks; `widen` doubles)
        self.tables = [np.full((slots, min(1024, pages_needed(g, longest) + 1)), STALE, np.int32) for g in groups]
        self.free_slots = list(range(slots - 1, -1, -1))

    # ------------------------------------------------------------------ slots

    def acquire(self) -> int:
        """A fresh slot: capacity 0, no pages."""
        if not self.free_slots:
            self.grow()
        slot = self.free_slots.pop()
        for gi in range(len(self.groups)):
            self.stale_next[gi, slot] = self.next_stale(gi, 0)
        return slot

    def release(self, slot: int) -> None:
        """Drop every page of `slot` (walking each table backwards, so that the
        tail is evicted before a shared prefix) and return the slot."""
        self.unmirror_slots([slot])
        nstales = self.nstale[:, slot].tolist()
        for gi, nblk in enumerate(self.nblk[:, slot].tolist()):
            if nblk:
                row = self.tables[gi][slot]
                pages = row[nstales[gi] : nblk].tolist()
                pages.reverse()
                self.pools[gi].release(pages)
                row[:nblk] = STALE
        self.cap_data[slot] = self.hist_data[slot] = 0
        self.nblk[:, slot] = self.nstale[:, slot] = 0
        self.thresholds[:, :, slot] = self.reset
        self.free_slots.append(slot)

    def live(self, gi: int, slot: int) -> int:
        return int(self.nblk[gi, slot] - self.nstale[gi, slot])

    # ------------------------------------------------------------------ moving shapes

    def resize_one(self, slot: int, cap: int, hist: int) -> Resize:
        """Move one unmirrored request (validated shape) unless a group lacks pages."""
        hi, lo, nxt = self.thresholds[:, :, slot].tolist()
        if cap > min(hi) or cap <= max(lo) or hist >= min(nxt):
            done = self.apply([slot], [cap], [hist])
            if not done:
                return done
        self.cap_data[slot] = cap
        self.hist_data[slot] = hist
        return RESIZED

    def resize_batch(
        self, slots: npt.NDArray[np.intp], caps: IntArray, hists: IntArray, *, dry_run: bool = False
    ) -> Resize:
        """Move a batch of distinct requests (validated shapes), all or none
        (`dry_run`: only answer)."""
        if self.mirrored:
            self.flush()
        c, h = caps[None, :], hists[None, :]
        crossing = (c > self.cap_hi[:, slots]) | (c <= self.cap_lo[:, slots]) | (h >= self.stale_next[:, slots])
        idx = np.flatnonzero(crossing.any(axis=0))
        if idx.size:
            done = self.apply(
                slots[idx].tolist(), caps[idx].tolist(), hists[idx].tolist(), crossing[:, idx].tolist(), dry_run=dry_run
            )
            if not done:
                return done
        if not dry_run:
            self.cap_data[slots] = caps
            self.hist_data[slots] = hists
        return RESIZED

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
        Mirrored requests among `slots` are unmirrored first (their thresholds move)."""
        if self.mirrored:
            self.unmirror_slots(slots)
        if len(slots) == 1:  # a view and a flat list: cheaper than fancy indexing
            old_nblk = [[n] for n in self.nblk[:, slots[0]].tolist()]
            old_nstale = [[n] for n in self.nstale[:, slots[0]].tolist()]
        else:
            old_nblk = self.nblk[:, slots].tolist()
            old_nstale = self.nstale[:, slots].tolist()
        plans: list[list[_Change]] = []
        short = {}
        for gi, g in enumerate(self.groups):
            row_mask, table = mask[gi] if mask else None, self.tables[gi]
            nblks, nstales = old_nblk[gi], old_nstale[gi]
            changes: list[_Change] = []
            need = 0
            released: list[int] = []
            for j, slot in enumerate(slots):
                if row_mask is not None and not row_mask[j]:
                    continue
                hist, nblk, nstale = hists[j], nblks[j], nstales[j]
                stale = stale_pages(g, hist)
                total = pages_needed(g, caps[j], hist) + stale
                if total == nblk and stale == nstale:
                    continue
                release = table[slot, nstale : min(stale, nblk)].tolist() if stale > nstale else []
                if total < nblk:
                    release += table[slot, total:nblk].tolist()
                first_new = max(nblk, stale)
                new = total - first_new if total > first_new else 0
                need += new
                released += release
                changes.append(_Change(slot, total, stale, first_new, new, release, nstale, nblk, hist))
            pool = self.pools[gi]
            if need > pool.num_free:
                missing = need - pool.num_free - _freed(pool, released)
                if missing > 0:
                    short[pool.name] = missing
            plans.append(changes)
        if short:
            return Resize(short)
        if dry_run:
            return RESIZED
        for gi, changes in enumerate(plans):
            table, pool = self.tables[gi], self.pools[gi]
            for ch in changes:
                if ch.release:
                    if ch.nstale > ch.old_nstale:
                        table[ch.slot, ch.old_nstale : min(ch.nstale, ch.old_nblk)] = STALE
                    if ch.nblk < ch.old_nblk:
                        table[ch.slot, ch.nblk : ch.old_nblk] = STALE
                    pool.release(ch.release)
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
                self.stale_next[gi, ch.slot] = self.next_stale(gi, ch.hist)

    def set_blocks(self, gi: int, slots: list[int], nblk: list[int], nstale: list[int]) -> None:
        """Record tables' block counts and the capacities that keep them."""
        tpb, state = self.tokens_per_block, self.is_state[gi]
        if len(slots) < 8:  # scalar writes beat building arrays for a few requests
            for slot, n, stale in zip(slots, nblk, nstale, strict=True):
                self.nblk[gi, slot] = n
                self.nstale[gi, slot] = stale
                if state:
                    self.cap_hi[gi, slot], self.cap_lo[gi, slot] = (NEVER, 0) if n else (0, -1)
                else:  # block j covers positions [j*tpb, (j+1)*tpb)
                    self.cap_hi[gi, slot] = n * tpb
                    self.cap_lo[gi, slot] = (n - 1) * tpb if n else -1
            return
        count = np.asarray(nblk, np.int64)
        self.nblk[gi, slots] = count
        self.nstale[gi, slots] = nstale
        if state:
            self.cap_hi[gi, slots] = np.where(count > 0, NEVER, 0)
            self.cap_lo[gi, slots] = np.where(count > 0, 0, -1)
        else:
            self.cap_hi[gi, slots] = count * tpb
            self.cap_lo[gi, slots] = np.where(count > 0, (count - 1) * tpb, -1)

    def next_stale(self, gi: int, hist: int) -> int:
        """Smallest history above `hist` at which `stale_pages` grows; searched
        with `stale_pages` itself (galloping, then bisection) so there is no
        second copy of the arithmetic."""
        if self.never_stale[gi]:
            return NEVER
        g = self.groups[gi]
        now = stale_pages(g, hist)
        guess = hist + self.tokens_per_block  # right at a crossing, the next is a page later
        if stale_pages(g, guess) > now and stale_pages(g, guess - 1) == now:
            return guess
        lo, step = hist, self.tokens_per_block
        while stale_pages(g, hist + step) == now:
            lo, step = hist + step, step * 2
        hi = hist + step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if stale_pages(g, mid) == now:
                lo = mid
            else:
                hi = mid
        return hi

    # ------------------------------------------------------------------ storage

    def grow(self) -> None:
        """Double the slot arrays (more live requests than planned for)."""
        old = self.cap_data.shape[0]

        def more(a: IntArray, fill: int) -> IntArray:
            return np.concatenate([a, np.full(a.shape[:-1] + (old,), fill, a.dtype)], axis=-1)

        self.cap_data, self.hist_data = more(self.cap_data, 0), more(self.hist_data, 0)
        self.nblk, self.nstale = more(self.nblk, 0), more(self.nstale, 0)
        self.thresholds = np.stack([more(self.thresholds[i], fill) for i, fill in enumerate((0, -1, NEVER))])
        self.cap_hi, self.cap_lo, self.stale_next = self.thresholds
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
