"""`ShapeArrays`: every slot's shape (capacity, history), its block counts per group and the
thresholds within which its tables stay as they are, in NumPy arrays by slot; and the
single-request path's mirror of one slot's numbers in plain ints on its `Request`.

A batched step compares whole arrays. A single `resize` would pay a NumPy scalar read or
write (0.1 to 0.3 us each) for every one of those numbers, more than a whole step costs in a
pure-Python block manager. So a request that a single resize moved keeps its numbers in its
`Request` (`mirror`): its shape, block counts and next-stale histories per group, and the
bounds that say whether the next resize crosses a page boundary in any group. Its resizes
then update only those ints (and the page ids in its tables, which are always current), and
the arrays lag behind for that slot. The properties `cap`, `hist`, `nblk`, `nstale`,
`cap_hi`, `cap_lo` and `stale_next` write every mirror back first (`flush`), so a reader of
the arrays (the integrity checker, a batch move, tools) always sees the truth; code on the
single-request path reads the mirror (`counts`, `Request.cap`) instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvpool.cache.request import Request
from kvpool.spec.groups import LayerGroup
from kvpool.spec.kinds import NEVER  # threshold of a group that never goes stale
from kvpool.spec.pages import stale_pages

IntArray = npt.NDArray[np.int64]
Ints = list[int] | npt.NDArray[np.integer[Any]]


def block_bounds(nblk: int, tokens_per_block: int, state: bool) -> tuple[int, int]:
    """(cap_hi, cap_lo): the capacities in `(cap_lo, cap_hi]` keep `nblk` blocks."""
    if state:  # one slot for any positive capacity
        return (NEVER, 0) if nblk else (0, -1)
    # block j covers positions [j*tpb, (j+1)*tpb)
    return nblk * tokens_per_block, (nblk - 1) * tokens_per_block if nblk else -1


class ShapeArrays:
    """Shapes, block counts and thresholds of `slots` slots of `groups`."""

    def __init__(self, groups: Sequence[LayerGroup], slots: int) -> None:
        self.groups = tuple(groups)
        self.tokens_per_block = groups[0].tokens_per_block
        self.is_state = [g.rule.per_request for g in groups]
        self.paged_only = not any(self.is_state)
        self.never_stale = [stale_pages(g, NEVER) == 0 for g in groups]
        n_groups = len(groups)
        self.cap_data: IntArray = np.zeros(slots, np.int64)
        self.hist_data: IntArray = np.zeros(slots, np.int64)
        self.nblk_data: IntArray = np.zeros((n_groups, slots), np.int64)
        self.nstale_data: IntArray = np.zeros((n_groups, slots), np.int64)
        # one array, so that a slot's three thresholds are one read
        self.thr_data: IntArray = np.zeros((3, n_groups, slots), np.int64)
        self.thr_data[1], self.thr_data[2] = -1, NEVER
        self.mirrored: dict[int, Request] = {}  # slot -> request whose mirror holds its numbers

    # ------------------------------------------------------------------ the arrays, current

    @property
    def cap(self) -> IntArray:
        """Capacity by slot (mirrors written back first, as for every array below)."""
        return self.flushed(self.cap_data)

    @property
    def hist(self) -> IntArray:
        return self.flushed(self.hist_data)

    @property
    def nblk(self) -> IntArray:
        """Blocks by group and slot (stale ones included)."""
        return self.flushed(self.nblk_data)

    @property
    def nstale(self) -> IntArray:
        return self.flushed(self.nstale_data)

    @property
    def cap_hi(self) -> IntArray:
        return self.flushed(self.thr_data[0])

    @property
    def cap_lo(self) -> IntArray:
        return self.flushed(self.thr_data[1])

    @property
    def stale_next(self) -> IntArray:
        return self.flushed(self.thr_data[2])

    def flushed(self, array: IntArray) -> IntArray:
        if self.mirrored:
            self.flush()
        return array

    # ------------------------------------------------------------------ mirrors

    def mirror(self, req: Request, limit: int) -> None:
        """Move `req`'s numbers into the request (capacities capped at `limit`)."""
        slot = req.slot
        req.cap, req.hist = int(self.cap_data[slot]), int(self.hist_data[slot])
        req.nblks = self.nblk_data[:, slot].tolist()
        req.nstales = self.nstale_data[:, slot].tolist()
        req.nxts = self.thr_data[2, :, slot].tolist()
        req.limit = limit
        self.mirrored[slot] = req
        self.rebound(req)

    def rebound(self, req: Request) -> None:
        """The mirror's bounds from its block counts: any capacity in `(lo, hi]`
        with a history below `nxt` moves no page in any group."""
        hi, lo, tpb, nblks = req.limit, -1, self.tokens_per_block, req.nblks
        if self.paged_only:  # block_bounds grow with the count: the fewest blocks bound hi, the most lo
            hi = min(hi, block_bounds(min(nblks), tpb, False)[0])
            lo = block_bounds(max(nblks), tpb, False)[1]
        else:
            for n, state in zip(nblks, self.is_state, strict=True):
                h, low = block_bounds(n, tpb, state)
                if h < hi:
                    hi = h
                if low > lo:
                    lo = low
        nxts = req.nxts
        req.lo, req.hi, req.nxt = lo, hi, nxts[0] if len(nxts) == 1 else min(nxts)

    def shape(self, req: Request) -> tuple[int, int]:
        """(capacity, history) of `req`, from its mirror if it has one."""
        if req.hi >= 0:
            return req.cap, req.hist
        return int(self.cap_data[req.slot]), int(self.hist_data[req.slot])

    def counts(self, req: Request) -> tuple[list[int], list[int]]:
        """(blocks, stale blocks) per group of `req`, from its mirror if it has one."""
        if req.hi >= 0:
            return req.nblks, req.nstales
        return self.nblk_data[:, req.slot].tolist(), self.nstale_data[:, req.slot].tolist()

    def unmirror(self, req: Request) -> None:
        """Write a mirrored request's numbers back into the arrays; drop its mirror."""
        if req.hi < 0:
            return
        slot, tpb = req.slot, self.tokens_per_block
        self.cap_data[slot], self.hist_data[slot] = req.cap, req.hist
        self.nblk_data[:, slot] = req.nblks
        self.nstale_data[:, slot] = req.nstales
        bounds = [block_bounds(n, tpb, s) for n, s in zip(req.nblks, self.is_state, strict=True)]
        self.thr_data[:, :, slot] = [[b[0] for b in bounds], [b[1] for b in bounds], req.nxts]
        req.hi = -1
        del self.mirrored[slot]

    def unmirror_slots(self, slots: list[int]) -> None:
        """`unmirror` the mirrored requests among `slots`."""
        for slot in slots:
            req = self.mirrored.get(slot)
            if req is not None:
                self.unmirror(req)

    def flush(self) -> None:
        """`unmirror` every mirrored request."""
        for req in list(self.mirrored.values()):
            self.unmirror(req)

    # ------------------------------------------------------------------ thresholds

    def set_blocks(self, gi: int, slots: Ints, nblk: Ints, nstale: Ints) -> None:
        """Record unmirrored tables' block counts and the capacities that keep them
        (lists or integer arrays, one entry per slot)."""
        tpb, state = self.tokens_per_block, self.is_state[gi]
        if len(slots) < 8:  # scalar writes beat building arrays for a few requests
            for slot, n, stale in zip(slots, nblk, nstale, strict=True):
                self.nblk_data[gi, slot] = n
                self.nstale_data[gi, slot] = stale
                self.thr_data[0, gi, slot], self.thr_data[1, gi, slot] = block_bounds(n, tpb, state)
            return
        count = np.asarray(nblk, np.int64)
        self.nblk_data[gi, slots] = count
        self.nstale_data[gi, slots] = nstale
        if state:
            self.thr_data[0, gi, slots] = np.where(count > 0, NEVER, 0)
            self.thr_data[1, gi, slots] = np.where(count > 0, 0, -1)
        else:
            self.thr_data[0, gi, slots] = count * tpb
            self.thr_data[1, gi, slots] = np.where(count > 0, (count - 1) * tpb, -1)

    def next_stale(self, gi: int, hist: int, now: int | None = None) -> int:
        """Smallest history above `hist` at which `stale_pages` grows (`now`:
        `stale_pages` at `hist`, if the caller knows it); searched with
        `stale_pages` itself (galloping, then bisection) so there is no second
        copy of the arithmetic."""
        if self.never_stale[gi]:
            return NEVER
        g = self.groups[gi]
        stale = g.rule.stale_pages  # what `stale_pages` calls: one frame less at every page a window drops
        if now is None:
            now = stale(g, hist)
        guess = hist + self.tokens_per_block  # right at a crossing, the next is a page later
        if stale(g, guess) > now and stale(g, guess - 1) == now:
            return guess
        lo, step = hist, self.tokens_per_block
        while stale(g, hist + step) == now:
            lo, step = hist + step, step * 2
        hi = hist + step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if stale(g, mid) == now:
                lo = mid
            else:
                hi = mid
        return hi

    def grow_shapes(self, old: int) -> None:
        """Double the slot arrays from `old` slots."""

        def more(a: IntArray, fill: int) -> IntArray:
            return np.concatenate([a, np.full(a.shape[:-1] + (old,), fill, a.dtype)], axis=-1)

        self.cap_data, self.hist_data = more(self.cap_data, 0), more(self.hist_data, 0)
        self.nblk_data, self.nstale_data = more(self.nblk_data, 0), more(self.nstale_data, 0)
        self.thr_data = np.stack([more(self.thr_data[i], fill) for i, fill in enumerate((0, -1, NEVER))])
