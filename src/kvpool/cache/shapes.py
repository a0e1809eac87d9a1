"""`ShapeArrays`: every slot's shape (capacity, history), its page-block counts and the
thresholds within which its tables stay as they are, in NumPy arrays by slot; and the
single-request fast path's mirror of one slot's shape in plain ints on its `Request`.

A batched step compares whole arrays; a single `resize` would pay a NumPy scalar read for
each of those numbers (about 0.1 us each), more than the whole step costs in a
pure-Python block manager. So after a single resize moved a request, its shape and the
bounds of the next page boundary are copied into the request (`mirror`), and the next
resizes that cross no boundary update only those ints. The arrays then lag behind: the
`cap`/`hist` properties, a batch move (`SlotTables.resize_batch`) and any table change
(`SlotTables.apply`) write the mirrors back first (`flush`, `unmirror`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvpool.cache.request import Request
from kvpool.spec.kinds import NEVER  # threshold of a group that never goes stale

IntArray = npt.NDArray[np.int64]


class ShapeArrays:
    """Shapes, block counts and thresholds of `slots` slots in `n_groups` groups."""

    def __init__(self, n_groups: int, slots: int) -> None:
        # the shapes; a mirrored slot's live shape is its `Request.cap`/`hist` (read `cap`/`hist`)
        self.cap_data: IntArray = np.zeros(slots, np.int64)
        self.hist_data: IntArray = np.zeros(slots, np.int64)
        self.mirrored: dict[int, Request] = {}  # slot -> request whose mirror holds its shape
        self.nblk: IntArray = np.zeros((n_groups, slots), np.int64)
        self.nstale: IntArray = np.zeros((n_groups, slots), np.int64)
        # one array, so that a single request's three thresholds are one read
        self.thresholds: IntArray = np.zeros((3, n_groups, slots), np.int64)
        self.thresholds[1], self.thresholds[2] = -1, NEVER
        self.cap_hi, self.cap_lo, self.stale_next = self.thresholds
        # a free slot's thresholds, written in one assignment by `SlotTables.release`
        self.reset = np.array([[0] * n_groups, [-1] * n_groups, [NEVER] * n_groups], np.int64)

    @property
    def cap(self) -> IntArray:
        """Capacity by slot (writes the mirrors back first, dropping them)."""
        if self.mirrored:
            self.flush()
        return self.cap_data

    @property
    def hist(self) -> IntArray:
        """History by slot (writes the mirrors back first, dropping them)."""
        if self.mirrored:
            self.flush()
        return self.hist_data

    def mirror(self, req: Request, limit: int | None) -> None:
        """Copy `req`'s shape and the bounds within which no group's table
        changes (capacity in `(lo, hi]`, history below `nxt`; `hi` at most
        `limit`) into the request as ints; its shape lives there from now on,
        until `unmirror` or `flush`."""
        slot = req.slot
        hi, lo, nxt = self.thresholds[:, :, slot].tolist()
        req.cap, req.hist = int(self.cap_data[slot]), int(self.hist_data[slot])
        req.lo, req.nxt = max(lo), min(nxt)
        req.hi = min(hi) if limit is None else min(min(hi), limit)
        self.mirrored[slot] = req

    def unmirror(self, req: Request) -> None:
        """Write a mirrored request's shape back into the arrays; drop its mirror."""
        if req.hi >= 0:
            self.cap_data[req.slot], self.hist_data[req.slot] = req.cap, req.hist
            req.hi = -1
            del self.mirrored[req.slot]

    def unmirror_slots(self, slots: list[int]) -> None:
        """`unmirror` the mirrored requests among `slots`."""
        for slot in slots:
            req = self.mirrored.get(slot)
            if req is not None:
                self.unmirror(req)

    def flush(self) -> None:
        """`unmirror` every mirrored request (before a batch move or a reader of the arrays)."""
        cap, hist = self.cap_data, self.hist_data
        for slot, req in self.mirrored.items():
            cap[slot], hist[slot] = req.cap, req.hist
            req.hi = -1
        self.mirrored.clear()
