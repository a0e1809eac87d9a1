"""The decode step's page crossing on a request's mirror (`cache/shapes.py`), without the
general planner.

A decode step moves a request by a token or a few. Most steps cross no page boundary (the
mirror's bounds answer those in `KVCacheCore.resize`); the rest cross exactly one: capacity
passes the end of its last block by at most one block, so each paged group whose last block
is full takes one page, and/or history passes the next stale position by one page, so one
page leaves each sliding window or finished chunk that reached it. `cross` does exactly that
case with plain ints and one table write per page. For everything else (a shrink, a jump of
more than a page, a state group's first slot, groups that share one pool, a pool with no page
to hand out) `cross` answers False, having changed nothing, and the caller takes the general path
(`SlotTables.plan_one` / `apply_one`), which gives the same tables (a property test drives
both on random shapes).
"""

from __future__ import annotations

from kvpool.cache.checks import INT64_MAX
from kvpool.cache.request import Request
from kvpool.cache.reuse import commit_next_page, store_before_release
from kvpool.cache.shapes import block_bounds
from kvpool.cache.slots import STALE, SlotTables
from kvpool.spec.groups import LayerGroup
from kvpool.spec.pages import stale_pages


def drops_one_page(group: LayerGroup, hist: int, nstale: int, nblk: int) -> bool:
    """Whether raising history to `hist` makes exactly one more of a table's
    `nblk` blocks (`nstale` stale now) go stale in `group`, by `stale_pages`."""
    return stale_pages(group, hist) == nstale + 1 and nstale < nblk


def cross(t: SlotTables, req: Request, cap: int, hist: int, keeps_stale: bool) -> bool:
    """Move mirrored `req` to (cap, hist) if that is a one-page crossing whose
    pages are free: releases first (a page going stale may be the one a growing
    group takes), then one new page per growing group, into the tables, the
    pools and the mirror. With `keeps_stale` (reuse on, some group goes stale)
    the pages about to go stale are stored first. False: not this case (a
    closed mirror, a lookup still to count, past `req.limit`), nothing
    changed. The caller has checked the shape: `req.hist <= hist <= cap`,
    `req.lo < cap`, and that some page moves (not `cap <= req.hi` with
    `hist < req.nxt`)."""
    if req.hi < 0 or req.nxt <= 0 or cap > req.limit:
        return False
    tpb, nblks, pools = t.tokens_per_block, req.nblks, t.pools
    if len(nblks) == 1 and hist < req.nxt and not t.is_state[0]:  # one group of pages growing: no loops
        return grow_single(t, req, cap, hist) if cap <= req.hi + tpb else False
    grow: list[int] = []
    if cap > req.hi:
        if cap > req.hi + tpb:
            return False
        is_state = t.is_state
        for gi, n in enumerate(nblks):
            if is_state[gi]:
                if not n:  # a state group's first slot: the planner's case
                    return False
            elif n * tpb < cap:
                if not pools[gi].free_stack and not pools[gi].lru_len:
                    return False
                grow.append(gi)
    slot = req.slot
    if hist >= req.nxt:
        drop = []
        nstales, groups = req.nstales, t.groups
        for gi, nxt in enumerate(req.nxts):
            if nxt <= hist:
                if not drops_one_page(groups[gi], hist, nstales[gi], nblks[gi]):
                    return False
                drop.append(gi)
        if keeps_stale and req.tokens is not None and not req.dummy:
            store_before_release(t, req, hist)
        for gi in drop:
            table, first = t.tables[gi], nstales[gi]
            pools[gi].release_one(table.item(slot, first))
            table[slot, first] = STALE
            nstales[gi] = first + 1
            req.nxts[gi] = t.next_stale(gi, hist, first + 1)
    for gi in grow:
        n = nblks[gi]
        table = t.tables[gi]
        if n >= table.shape[1]:
            table = t.widen(gi, n + 1)
        table[slot, n] = pools[gi].take_one()
        nblks[gi] = n + 1
    req.cap, req.hist = cap, hist
    if grow:
        t.rebound(req)
    else:  # no block count changed: the capacity bounds stand
        nxts = req.nxts
        req.nxt = nxts[0] if len(nxts) == 1 else min(nxts)
    return True


def grow_single(t: SlotTables, req: Request, cap: int, hist: int) -> bool:
    """`cross` for tables of one group of pages when nothing goes stale:
    capacity passed the end of the last block by at most one block, so the
    request takes one page (False, nothing changed, if the pool has none)."""
    pool, n = t.pools[0], req.nblks[0]
    if not pool.free_stack and not pool.lru_len:
        return False
    table = t.tables[0]
    if n >= table.shape[1]:
        table = t.widen(0, n + 1)
    table[req.slot, n] = pool.take_one()
    req.nblks[0] = n + 1
    hi, req.lo = block_bounds(n + 1, t.tokens_per_block, False)
    req.cap, req.hist, req.hi = cap, hist, min(req.limit, hi)
    return True


def advance_across(t: SlotTables, req: Request, token: int, keeps_stale: bool) -> bool:
    """`KVCacheCore.advance` of mirrored `req` by one position with the id
    `token`, as one move: the page crossing (`cross`, or none), then `token`
    appended to the known ids and the page it completes, if any, committed
    (`commit_next_page`, so tables of pages only), as `resize` then `commit`
    would, without their checks. False, nothing changed: not that case (no
    int64 id, known ids short of history, a commit of more than one page, a
    shape `cross` declines)."""
    cap, hist, tpb, tokens = req.cap + 1, req.hist + 1, t.tokens_per_block, req.tokens
    if (
        tokens is None
        or type(token) is not int
        or not 0 <= token <= INT64_MAX
        or req.base + len(tokens) != req.hist
        or hist >= (req.committed + 2) * tpb
        or cap <= req.lo
    ):
        return False
    if cap <= req.hi and hist < req.nxt:  # no page moves: only a page completes
        req.cap, req.hist = cap, hist
    elif not cross(t, req, cap, hist, keeps_stale):
        return False
    tokens.append(token)
    if hist >= (req.committed + 1) * tpb:
        commit_next_page(t, req)
    return True
