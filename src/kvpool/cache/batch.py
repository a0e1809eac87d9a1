"""Moving a batch of requests at once (`KVCacheManager.resize_many`, `extend`): the capacity
check, storing the pages that are about to go stale (with reuse on), then one vectorised
move of the slot tables, all or nothing (docs/design.md, rule 6).

Three vector comparisons against each slot's thresholds find the requests that cross a page
boundary. When every crossing is one page in groups of pages of their own (a decode step:
capacity passes the end of its last block by at most one block, history moves one page out of
a window), `cross_by_one` drops and hands out the pages and updates the counts with a few
array operations; anything else goes through the planner (`SlotTables.apply`), which gives
the same tables (the batch-path tests drive both)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from kvpool.cache import reuse
from kvpool.cache.checks import check_capacity
from kvpool.cache.crossing import drops_one_page
from kvpool.cache.request import Requests
from kvpool.cache.results import RESIZED, Resize
from kvpool.cache.shapes import IntArray
from kvpool.cache.slots import STALE, SlotTables


def move(
    t: SlotTables,
    requests: Requests,
    rids: Sequence[int],
    slots: npt.NDArray[np.intp],
    caps: npt.NDArray[np.int64],
    hists: npt.NDArray[np.int64],
    max_capacity: int,
    keeps_stale: bool,
) -> Resize:
    """Move requests `rids` (in `slots`, validated shapes) to `caps`/`hists`.
    Raises `CacheUsageError` for a capacity past `max_capacity` (dummies
    aside) before anything changes. `keeps_stale`: reuse is on and some group
    releases pages that leave a window, so those are stored first."""
    if len(caps) and int(caps.max()) > max_capacity:
        for j in np.flatnonzero(caps > max_capacity).tolist():
            if not requests.get(rids[j]).dummy:
                check_capacity(rids[j], int(caps[j]), max_capacity)
    if keeps_stale:
        going = [
            (requests.get(rids[j]), int(hists[j]))
            for j in np.flatnonzero(hists >= t.stale_next[:, slots].min(axis=0)).tolist()
        ]
        going = [(req, h) for req, h in going if req.tokens is not None and not req.dummy]
        if going:
            dry = resize_batch(t, slots, caps, hists, dry_run=True)
            if not dry:
                return dry
            for req, h in going:
                reuse.store_before_release(t, req, h)
    return resize_batch(t, slots, caps, hists)


def resize_batch(
    t: SlotTables, slots: npt.NDArray[np.intp], caps: IntArray, hists: IntArray, *, dry_run: bool = False
) -> Resize:
    """Move a batch of distinct requests (validated shapes) in tables `t`, all
    or none (`dry_run`: only answer). Mirrors are written back first."""
    if t.mirrored:
        t.flush()
    c, h, thr = caps[None, :], hists[None, :], t.thr_data[:, :, slots]  # one gather
    grows, shrinks, stales = c > thr[0], c <= thr[1], h >= thr[2]
    crossing = grows | shrinks | stales
    idx = np.flatnonzero(crossing.any(axis=0))
    if idx.size:
        simple = not t.shared and not shrinks.any() and not (c > thr[0] + t.tokens_per_block).any()
        if not (simple and cross_by_one(t, slots[idx], hists[idx], grows[:, idx], stales[:, idx], dry_run)):
            done = t.apply(
                slots[idx].tolist(), caps[idx].tolist(), hists[idx].tolist(), crossing[:, idx].tolist(), dry_run=dry_run
            )
            if not done:
                return done
    if not dry_run:
        t.cap_data[slots] = caps
        t.hist_data[slots] = hists
    return RESIZED


def cross_by_one(
    t: SlotTables,
    slots: npt.NDArray[np.intp],
    hists: IntArray,
    grows: npt.NDArray[np.bool_],
    stales: npt.NDArray[np.bool_],
    dry_run: bool,
) -> bool:
    """The batch's crossings when each is one page: where `stales[gi, j]`,
    `slots[j]` drops the one page of group `gi` that leaves its window at
    history `hists[j]`; then where `grows[gi, j]` it takes one page (capacity
    passed the end of its last block by at most one block; no pool is shared,
    nothing shrinks). False, having changed nothing, when a drop is more than
    one page, a pool lacks the pages for the grows (counted before the drops
    free any) or a state group grows: the planner's cases."""
    drops = [np.flatnonzero(g).tolist() for g in stales]
    for gi, rows in enumerate(drops):
        if rows:
            nstale, nblk = t.nstale_data[gi, slots[rows]].tolist(), t.nblk_data[gi, slots[rows]].tolist()
            group, hs = t.groups[gi], hists[rows].tolist()
            if not all(map(partial(drops_one_page, group), hs, nstale, nblk)):
                return False
    grown = [np.flatnonzero(g) for g in grows]
    for gi, r in enumerate(grown):
        if r.size and (t.is_state[gi] or r.size > t.pools[gi].num_free):
            return False
    if dry_run:
        return True
    for gi, rows in enumerate(drops):
        if rows:
            drop_one(t, gi, slots[rows], hists[rows].tolist())
    for gi, r in enumerate(grown):
        if r.size:
            grow_one(t, gi, slots[r])
    return True


def drop_one(t: SlotTables, gi: int, slots: npt.NDArray[np.intp], hists: list[int]) -> None:
    """Release the first live page of group `gi` in each of `slots` (it left
    the window at the history in `hists`) and move its stale count on."""
    cols = t.nstale_data[gi, slots]
    table = t.tables[gi]
    pages = table[slots, cols].tolist()
    table[slots, cols] = STALE
    t.pools[gi].release(pages)
    t.nstale_data[gi, slots] = cols + 1
    t.thr_data[2, gi, slots] = [t.next_stale(gi, h) for h in hists]


def grow_one(t: SlotTables, gi: int, slots: npt.NDArray[np.intp]) -> None:
    """One new page at the end of group `gi`'s table in each of `slots`, with
    the block counts and capacity thresholds that go with it."""
    cols = t.nblk_data[gi, slots]
    table = t.tables[gi]
    if int(cols.max()) >= table.shape[1]:
        table = t.widen(gi, int(cols.max()) + 1)
    table[slots, cols] = t.pools[gi].take(len(slots))
    t.set_blocks(gi, slots, cols + 1, t.nstale_data[gi, slots])
