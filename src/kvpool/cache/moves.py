"""The manager's move of rows, all or none (docs/design.md, rule 6).

Every move, single or batched, is the same: requests whose pages stay as they
are took the new shape already (their callers' early return, the common
decode step); the others, the rows given here, are planned, checked against
the pools together, and applied, or nothing changes. The decode step's
crossing takes the move's own early return (`PageTables.cross`). A request's
first successful move counts its prefix lookup in the manager's reuse
counters (`count_lookups`).

The functions run over the manager's state (its page tables, request registry
and reuse counters); the resize methods call them directly, no layer between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from kvpool.cache.checks import check_capacity
from kvpool.cache.events import CacheUsageError
from kvpool.cache.request import Request
from kvpool.cache.results import RESIZED, Resize

if TYPE_CHECKING:
    from kvpool.cache.manager import KVCacheManager

Row = tuple[Request, int, int]  # (request, capacity, history)


def move(mgr: KVCacheManager, rows: Sequence[Row]) -> Resize:
    """Move each (request, cap, hist) of `rows` (shapes valid but for the
    capacity limit: CacheUsageError past it) if the pools hold them all;
    else change nothing. The decode step's crossing
    takes its early return (`PageTables.cross`); the rest are planned,
    checked together and applied. With reuse on, the pages about to leave a
    window are stored first; a request's first successful move counts its
    prefix lookup."""
    t = mgr.tables
    if t.cross(rows):
        if mgr.requests.pending_lookups:
            count_lookups(mgr, (req for req, _, _ in rows))
        return RESIZED
    for req, cap, _ in rows:
        if cap > req.limit:
            check_capacity(req.rid, cap, req.limit)  # raises
    moves = [t.plan(req, cap, hist) for req, cap, hist in rows]
    short = t.shortfall(moves)
    if short:
        return Resize(short)
    if t.before_release is not None:  # (reuse on and a group whose pages go stale: `prefix.store_leaving`)
        t.before_release(rows)
    t.apply(moves)
    if mgr.requests.pending_lookups:
        count_lookups(mgr, (req for req, _, _ in rows))
    return RESIZED


def move_rows(
    mgr: KVCacheManager, reqs: list[Request], rows: list[Row], old: Callable[[int], tuple[int, int]]
) -> Resize:
    """Move the `rows` of batch `reqs` (validated shapes but for the
    capacity limit) whose pages move, all or none: the other requests took
    their early return already, and `old(j)` gives request j's shape back
    when the rows are refused (a capacity past the limit raises). A batch
    that moved counts the prefix lookups of all its requests."""
    if rows:
        try:
            done = move(mgr, rows)
        except CacheUsageError:
            _undo(reqs, rows, old)
            raise
        if not done:
            _undo(reqs, rows, old)
            return done
    if mgr.requests.pending_lookups:
        count_lookups(mgr, reqs)
    return RESIZED


def _undo(reqs: list[Request], rows: list[Row], old: Callable[[int], tuple[int, int]]) -> None:
    """Give back their old shapes to the rows of a refused batch that took
    the early return (every row not among the moving `rows`)."""
    planned = {id(row[0]) for row in rows}
    for j, req in enumerate(reqs):
        if id(req) not in planned:
            req.cap, req.hist = old(j)


def count_lookups(mgr: KVCacheManager, reqs: Iterable[Request]) -> None:
    """Count the prefix lookups of `reqs`, whose move succeeded (once each)."""
    for req in reqs:
        if req.lookup is not None:
            mgr.reuse_queried_tokens += req.lookup[0]
            mgr.reuse_hit_tokens += req.lookup[1]
            req.lookup = None
            mgr.requests.pending_lookups -= 1
