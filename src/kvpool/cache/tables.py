"""`PageTables`: every request's block table per group, and the one move of a
request's pages to a new shape.

A request is a (capacity, history) pair (docs/design.md, vocabulary). Its table in
a group has one entry per page-sized block of positions; blocks that left a window
or a finished chunk hold `STALE`. How many entries a shape spans and how many of
them are stale is the group's kind rule's answer (`spec.pages.table_blocks` and
`stale_pages`, rule 1), never worked out here.

A move is planned per request (`plan`: one `Change` per group whose table moves),
checked against the pools for a whole batch at once (`shortfall`, groups that share
a pool summed), and applied only if everything fits (`apply`: every release first,
then the new pages; rule 6). The request's record (`cache/request.py`) holds the
counts; the tables hold the page ids, one NumPy row per request (`slot`), so a
batch's tables can be read as one array.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from kvpool.cache.pool import PagePool
from kvpool.cache.request import Request
from kvpool.spec.groups import LayerGroup
from kvpool.spec.kinds import NEVER
from kvpool.spec.pages import stale_pages, table_blocks

STALE = -1  # block-table entry of a block that has no page (stale or never needed)
STALE_STEPS = 1 << 12  # histories `PageTables.stale_step` keeps per group (a 64k context's crossings, 16-token pages)


# How one request's table in group `gi` moves (plain tuples: a step that crosses a page boundary
# builds one of each, and a NamedTuple costs five times as much to make):
# Change = (gi, nblk, nstale, release, first_new, new): to `nblk` entries of which the first
# `nstale` are stale, releasing `release` (one owner each) and taking `new` pages for entries
# `first_new..nblk-1`.
Change: TypeAlias = tuple[int, int, int, list[int], int, int]
# Move = (request, cap, hist, changes): a planned move of one request to (cap, hist).
Move: TypeAlias = tuple[Request, int, int, list[Change]]


class PageTables:
    """Block tables of up to `slots` requests (growing on demand) over one pool
    per group. Only `apply`, `release` and a prefix hit's
    writes (`fresh_row`, `set_counts`) change anything."""

    def __init__(self, groups: Sequence[LayerGroup], pools: list[PagePool], slots: int, longest: int) -> None:
        self.groups = tuple(groups)
        self.pools = pools
        self.tokens_per_block = groups[0].tokens_per_block
        self.is_state = [g.rule.per_request for g in groups]
        self.never_stale = [stale_pages(g, NEVER) == 0 for g in groups]
        self.paged_only = not any(self.is_state)
        # groups drawing from one store (`cache/shared_pool.py`) are counted together
        stores = [id(p.store) for p in pools]
        self.store_of = [stores.index(s) for s in stores]
        self.shared = len(set(stores)) < len(stores)
        self.crossable = self.paged_only and not self.shared  # the decode crossing's early return applies
        # called with a crossing's rows before it releases the pages that leave a window (the manager stores them)
        self.before_release: Callable[[Sequence[tuple[Request, int, int]]], None] | None = None
        # per group, history -> (stale_pages, next history where it grows): pure functions of the history, and
        # every request crosses at the same histories, so a decode step finds them here (`stale_step`)
        self.stale_steps: list[dict[int, tuple[int, int]]] = [{} for _ in groups]
        # wide enough for `longest` positions (at most 1024 blocks; `widen` doubles)
        self.tables = [np.full((slots, min(1024, table_blocks(g, longest) + 1)), STALE, np.int32) for g in groups]
        # per group, each row's entries as a memoryview: the per-step paths read and write single entries
        # there (a tenth of the cost of NumPy's scalar indexing); `add_slots` and `widen` make them again
        self.rows = [row_views(t) for t in self.tables]
        self.free_slots = list(range(slots - 1, -1, -1))

    # ------------------------------------------------------------------ requests

    def new_request(self, rid: int, *, dummy: bool, limit: int) -> Request:
        """A request of capacity 0 (no pages) in a fresh row, capacities up to `limit`."""
        if not self.free_slots:
            self.add_slots()
        n = len(self.groups)
        req = Request(
            rid, slot=self.free_slots.pop(), dummy=dummy, limit=limit, nblk=[0] * n, nstale=[0] * n, stale_at=[0] * n
        )
        req.stale_at = [self.next_stale(gi, 0) for gi in range(n)]
        self.rebound(req)
        return req

    def release(self, req: Request) -> None:
        """Drop every page of `req` and give its row back."""
        self.drop_pages(req)
        self.free_slots.append(req.slot)

    def live_pages(self, req: Request) -> list[list[int]]:
        """The live pages `req` holds, per group (its rows, read)."""
        return [self.tables[gi][req.slot, req.nstale[gi] : nblk].tolist() for gi, nblk in enumerate(req.nblk)]

    def drop_pages(self, req: Request) -> None:
        """Release `req`'s pages in every group (walking each table backwards,
        so that the tail is evicted before a shared prefix), leaving its counts
        as they are and its row `STALE`."""
        for gi, nblk in enumerate(req.nblk):
            nstale = req.nstale[gi]
            if nblk > nstale:
                row = self.tables[gi][req.slot]
                self.pools[gi].release(row[nstale:nblk][::-1].tolist())  # reversed by NumPy: no second list
                row[:nblk] = STALE

    def take_pages(self, req: Request) -> list[list[int]]:
        """Fresh pages for the live entries of `req`'s rows, per group (a suspended
        request coming back; the caller checked `num_free`), not yet in its rows:
        `fill_rows` puts them there, `give_back` returns them to the free lists."""
        return [pool.take(req.live(gi)) if req.live(gi) else [] for gi, pool in enumerate(self.pools)]

    def fill_rows(self, req: Request, pages: Sequence[Sequence[int]]) -> None:
        for gi, group_pages in enumerate(pages):
            self.tables[gi][req.slot, req.nstale[gi] : req.nblk[gi]] = group_pages

    def give_back(self, pages: Sequence[Sequence[int]]) -> None:
        """Undo `take_pages`: its pages free again, on top of the free lists in the
        order they were taken from them (a cached page it evicted stays evicted)."""
        for pool, group_pages in zip(self.pools, pages, strict=True):
            pool.release(group_pages[::-1])

    def rebound(self, req: Request) -> None:
        """`req.lo`, `req.hi`, `req.next_stale` from its counts: the capacities
        in `(lo, hi]` keep every group's block count (the shapes whose
        `table_blocks` is `nblk`), histories below `next_stale` its stale count."""
        tpb, nblk = self.tokens_per_block, req.nblk
        if self.paged_only:  # block j covers positions [j*tpb, (j+1)*tpb): the fewest blocks bound hi, the most lo
            fewest, most = (nblk[0], nblk[0]) if len(nblk) == 1 else (min(nblk), max(nblk))
            hi, lo = fewest * tpb, (most - 1) * tpb if most else -1
        else:
            hi, lo = NEVER, -1
            for n, state in zip(nblk, self.is_state, strict=True):
                if state:  # one slot for any positive capacity
                    h, low = (NEVER, 0) if n else (0, -1)
                else:
                    h, low = n * tpb, (n - 1) * tpb if n else -1
                if h < hi:
                    hi = h
                if low > lo:
                    lo = low
        stale_at = req.stale_at
        req.lo, req.hi = lo, hi if hi < req.limit else req.limit
        req.next_stale = stale_at[0] if len(stale_at) == 1 else min(stale_at)

    def next_stale(self, gi: int, hist: int, now: int | None = None) -> int:
        """Smallest history above `hist` at which `stale_pages` grows (`now`:
        `stale_pages` at `hist`, if the caller knows it); searched with
        `stale_pages` itself (galloping, then bisection) so there is no second
        copy of the arithmetic."""
        if self.never_stale[gi]:
            return NEVER
        g = self.groups[gi]
        stale = g.rule.stale_pages
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

    def stale_step(self, gi: int, hist: int) -> tuple[int, int]:
        """(`stale_pages` at `hist`, `next_stale` after it) in group `gi`,
        remembered per history (at most `STALE_STEPS` of them per group)."""
        step = self.stale_steps[gi].get(hist)
        if step is None:
            now = stale_pages(self.groups[gi], hist)
            step = (now, self.next_stale(gi, hist, now))
            if len(self.stale_steps[gi]) >= STALE_STEPS:
                self.stale_steps[gi].clear()
            self.stale_steps[gi][hist] = step
        return step

    # ------------------------------------------------------------------ moving

    def cross(self, rows: Sequence[tuple[Request, int, int]]) -> bool:
        """Move every (request, cap, hist) of `rows` if all of them are the
        decode step's crossing, the move's early return; False, nothing
        changed, if not. The crossing: capacity passes the end of the tables
        by at most one block (within the request's limit) and/or history
        moves one page out of each window it leaves, with no pool shared, no
        state group, and a free or evictable page in each pool for every row
        that grows. Moved as `apply` moves their plans: first every page that
        leaves a window (after `before_release`), then one page per growing
        row and group, in row order. Tables of pages only have
        `ceil(cap / tpb)` entries in every group, so a row whose capacity
        passes `hi` (`fewest * tpb`, not clamped as cap <= limit) by at most a
        block grows one entry in every group: `lo` becomes the old `hi`, `hi`
        moves a block on, with no `rebound`."""
        if not self.crossable:
            return False
        tpb = self.tokens_per_block
        growing = dropping = 0
        for req, cap, hist in rows:
            hi = req.hi
            if cap <= req.lo or cap > hi + tpb:
                return False
            if hist >= req.next_stale:
                if not self.leaves_one_page(req, hist):
                    return False
                dropping += 1
            if cap > hi:
                if cap > req.limit:
                    return False
                growing += 1
        pools = self.pools
        if growing:  # a row that grows takes a page in every group: free or evicted
            for pool in pools:
                if len(pool.free_stack) < growing and pool.num_free < growing:
                    return False
        if dropping:
            if self.before_release is not None:
                self.before_release(rows)
            self.leave_windows(rows)
        if not growing:
            for req, cap, hist in rows:
                req.cap = cap
                req.hist = hist
            return True
        # one page per group for each growing row, in row order: a slice of each free stack, or where
        # rows must evict and the evictions are seen (a `removed` record or a cold-tier spill per eviction),
        # pages taken as `apply` takes them; unseen, one eviction of many pages leaves each pool as many
        # evictions of one do (pools are not shared here). The first group's are written in the pass
        # that moves the rows' shapes, the other groups' after it (`grow_others`)
        evicts = (
            growing > 1
            and any(len(pool.free_stack) < growing for pool in pools)
            and any(pool.evictions_seen for pool in pools)
        )
        taken = self.take_evicting(growing) if evicts else None
        pages, views, k = pools[0].take(growing) if taken is None else taken[0], self.rows[0], 0
        others = len(pools) > 1
        grown: list[Request] = []
        for req, cap, hist in rows:
            hi = req.hi
            if cap > hi:  # one more entry in every group (lo < old cap <= hi: the old hi is the new lo)
                nblk = req.nblk
                n = nblk[0]
                try:
                    views[req.slot][n] = pages[k]
                except IndexError:  # past the tables' width (checking each write costs more)
                    self.widen(0, n + 1)
                    views = self.rows[0]
                    views[req.slot][n] = pages[k]
                nblk[0] = n + 1
                k += 1
                if others:
                    grown.append(req)
                req.lo = hi
                hi += tpb
                req.hi = hi if hi < req.limit else req.limit
            req.cap = cap
            req.hist = hist
        if others:
            self.grow_others(grown, taken)
        return True

    def leaves_one_page(self, req: Request, hist: int) -> bool:
        """Whether raising `req`'s history to `hist` makes exactly one more
        page stale in each group whose `stale_at` it reaches (a window moves
        on by one page; a stale_pages jump or an empty table is the planner's)."""
        nstale, nblk = req.nstale, req.nblk
        for gi, at in enumerate(req.stale_at):
            if hist >= at and not (nstale[gi] < nblk[gi] and self.stale_step(gi, hist)[0] == nstale[gi] + 1):
                return False
        return True

    def leave_windows(self, rows: Sequence[tuple[Request, int, int]]) -> None:
        """`cross`'s releases: each row drops the first live page of every
        group whose `stale_at` its history reached (`cross` checked that it is
        exactly one), group by group, a group's pages released at once."""
        for gi, pool in enumerate(self.pools):
            views, steps, pages = self.rows[gi], self.stale_steps[gi], []
            for req, _, hist in rows:
                stale_at = req.stale_at
                if hist >= stale_at[gi]:
                    nstale, row = req.nstale, views[req.slot]
                    first = nstale[gi]
                    pages.append(row[first])
                    row[first] = STALE
                    nstale[gi] = first + 1
                    stale_at[gi] = (steps.get(hist) or self.stale_step(gi, hist))[1]  # `cross` asked for it
            if pages:
                pool.release(pages)
        for req, _, hist in rows:
            if hist >= req.next_stale:
                stale_at = req.stale_at
                req.next_stale = stale_at[0] if len(stale_at) == 1 else min(stale_at)

    def grow_others(self, grown: list[Request], taken: list[list[int]] | None) -> None:
        """`cross`'s pages of the groups after the first: the entry each of
        the `grown` rows just gained in the first group (tables of pages have
        `ceil(cap / tpb)` entries in every group), from `taken` or each pool's
        free stack."""
        for gi in range(1, len(self.pools)):
            views = self.rows[gi]
            pages = self.pools[gi].take(len(grown)) if taken is None else taken[gi]
            for req, page in zip(grown, pages, strict=True):
                nblk = req.nblk
                n = nblk[gi]
                try:
                    views[req.slot][n] = page
                except IndexError:  # past the tables' width
                    self.widen(gi, n + 1)
                    views = self.rows[gi]
                    views[req.slot][n] = page
                nblk[gi] = n + 1

    def take_evicting(self, rows: int) -> list[list[int]]:
        """`cross`'s pages when a pool must evict for several rows: one page
        per group for each of `rows` growing rows, taken row by row as `apply`
        takes them (the same cached pages evicted in the same order: the same
        events and cold-tier spills); per group in row order. (One row takes
        group by group either way.)"""
        taken: list[list[int]] = [[] for _ in self.pools]
        for _ in range(rows):
            for pool, pages in zip(self.pools, taken, strict=True):
                pages += pool.take(1)
        return taken

    def plan(self, req: Request, cap: int, hist: int) -> Move:
        """How `req`'s tables move to (cap, hist) (a validated shape), by
        `table_blocks` and `stale_pages`; changes nothing."""
        changes = []
        row = req.slot
        for gi, g in enumerate(self.groups):
            nblk, nstale = req.nblk[gi], req.nstale[gi]
            stale = nstale if hist < req.stale_at[gi] else stale_pages(g, hist)
            total = table_blocks(g, cap)
            if total == nblk and stale == nstale:
                continue
            table = self.tables[gi]
            if stale == nstale:
                release = []
            elif stale == nstale + 1 and stale <= nblk:  # one page leaves a window: no slice
                release = [table.item(row, nstale)]
            else:
                release = table[row, nstale : min(stale, nblk)].tolist() if stale > nstale else []
            if total < nblk:
                release += table[row, total:nblk].tolist()
            first_new = nblk if nblk > stale else stale
            changes.append((gi, total, stale, release, first_new, total - first_new if total > first_new else 0))
        return req, cap, hist, changes

    def shortfall(self, moves: Sequence[Move]) -> dict[str, int]:
        """Pages missing per pool for planned `moves` taken together (groups
        that share a pool are summed and named by the pool); empty if they fit."""
        pools = self.pools
        if len(moves) == 1 and not self.shared:  # early return: one request, a pool per group, pages to spare
            for gi, _, _, _, _, new in moves[0][3]:
                if new > pools[gi].num_free:
                    break
            else:
                return {}
        need = [0] * len(pools)  # by the first group of each store
        store_of = self.store_of
        for move in moves:
            for ch in move[3]:
                if ch[5]:
                    need[store_of[ch[0]]] += ch[5]
        short: dict[str, int] = {}
        for s, n in enumerate(need):
            if n and n > self.pools[s].num_free:
                pool = self.pools[s]
                # a released page whose every owner lets go becomes allocatable again
                count: dict[int, int] = {}
                for move in moves:
                    for ch in move[3]:
                        if store_of[ch[0]] == s:
                            for p in ch[3]:
                                count[p] = count.get(p, 0) + 1
                missing = n - pool.num_free - sum(1 for p, c in count.items() if pool.ref[p] == c)
                if missing > 0:
                    short[pool.store.name] = missing
        return short

    def apply(self, moves: Sequence[Move]) -> None:
        """Carry out planned moves that fit (`shortfall` empty): every release
        before the new pages it may free (across the whole batch, or within a
        group when one request moves over pools of its own), then the
        records' shapes, counts and bounds."""
        tables, pools = self.tables, self.pools
        releases_first = len(moves) > 1 or self.shared  # a page one request lets go may be one another takes
        if releases_first:
            for move in moves:
                for change in move[3]:
                    if change[3]:
                        self.unlink(move[0], change)
        for req, cap, hist, changes in moves:
            for change in changes:
                gi, nblk, nstale, release, first_new, new = change
                if release and not releases_first:
                    self.unlink(req, change)
                if new == 1:
                    table = tables[gi] if nblk <= tables[gi].shape[1] else self.widen(gi, nblk)
                    table[req.slot, first_new] = pools[gi].take(1)[0]
                elif new:
                    table = tables[gi] if nblk <= tables[gi].shape[1] else self.widen(gi, nblk)
                    table[req.slot, first_new:nblk] = pools[gi].take(new)
                req.nblk[gi] = nblk
                if nstale != req.nstale[gi]:
                    req.nstale[gi] = nstale
                    req.stale_at[gi] = self.next_stale(gi, hist, nstale)
            req.cap, req.hist = cap, hist
            if changes:
                self.rebound(req)

    def unlink(self, req: Request, change: Change) -> None:
        """Release a planned change's pages and mark their entries `STALE`
        (the record's counts still the old ones)."""
        gi, nblk, nstale, release, _, _ = change
        row, old_stale, old_nblk = self.tables[gi][req.slot], req.nstale[gi], req.nblk[gi]
        if nstale == old_stale + 1 and nstale <= old_nblk:  # one page left a window: no slice
            row[old_stale] = STALE
        elif nstale > old_stale:
            row[old_stale : min(nstale, old_nblk)] = STALE
        if nblk < old_nblk:
            row[nblk:old_nblk] = STALE
        self.pools[gi].release(release)

    def fresh_row(self, req: Request, gi: int, width: int) -> npt.NDArray[np.int32]:
        """`req`'s whole row in group `gi`, at least `width` entries wide, for a
        prefix hit to write its pages into (then `set_counts`)."""
        table = self.tables[gi] if width <= self.tables[gi].shape[1] else self.widen(gi, width)
        row: npt.NDArray[np.int32] = table[req.slot]
        return row

    def set_counts(self, req: Request, gi: int, nblk: int, nstale: int, hist: int) -> None:
        """Record that `req`'s table in group `gi` now has `nblk` entries, the
        first `nstale` stale, at history `hist` (call `rebound` after the last group)."""
        req.nblk[gi], req.nstale[gi] = nblk, nstale
        req.stale_at[gi] = self.next_stale(gi, hist, nstale)

    def row(self, req: Request, gi: int) -> npt.NDArray[np.int32]:
        """`req`'s table in group `gi` (a view of its entries)."""
        return self.tables[gi][req.slot, : req.nblk[gi]]

    # ------------------------------------------------------------------ storage

    def add_slots(self) -> None:
        """Double the rows (more live requests than planned for)."""
        old = self.tables[0].shape[0]
        self.tables = [np.concatenate([t, np.full_like(t, STALE)]) for t in self.tables]
        self.rows = [row_views(t) for t in self.tables]
        self.free_slots = list(range(2 * old - 1, old - 1, -1)) + self.free_slots

    def widen(self, gi: int, width: int) -> npt.NDArray[np.int32]:
        """Make group `gi`'s tables at least `width` blocks wide (doubling)."""
        t = self.tables[gi]
        wide = np.full((t.shape[0], max(width, 2 * t.shape[1])), STALE, np.int32)
        wide[:, : t.shape[1]] = t
        self.tables[gi] = wide
        self.rows[gi] = row_views(wide)
        return wide


def row_views(table: npt.NDArray[np.int32]) -> list[memoryview]:
    """Each row of `table` as a writable memoryview of its int32 entries."""
    return [row.data for row in table]
