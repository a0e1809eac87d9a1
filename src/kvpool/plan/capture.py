"""The warmup dry run as page arithmetic: dummy shapes, the capacity query and
the CUDA-graph warmup, over anything that counts pages (`DummyPages`).

A generation dummy of `token_num` (= history + the current input token) has
capacity `token_num + draft_len + E` and history `token_num - 1` (docs/design.md,
rule 2): the current input is inside `token_num` and is not counted again, so
a `token_num` from `max_generation_length` that ends on a page boundary still
fits. A context dummy of `token_num` has capacity `token_num + E`, history 0.

The same functions run on the real manager (`KVCacheManager.warmup`) and on a
plan's bare page counts (`plan.plan_pages.PlanPages`): the plan's warnings
about CUDA-graph sizes and `kvpool warmup` are one computation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpool.errors import OutOfPagesError
from kvpool.plan.feasibility import largest_fitting
from kvpool.plan.limits import ServingLimits
from kvpool.spec.groups import LayerGroup
from kvpool.spec.pages import decode_worst_case_pages, pages_needed


class DummyRows(Protocol):
    """What `add_dummy_requests` answers: truthy on success, with the ids."""

    @property
    def ids(self) -> tuple[int, ...]: ...
    @property
    def short(self) -> Mapping[str, int]: ...
    def __bool__(self) -> bool: ...


@dataclass(frozen=True)
class Rows:
    """`DummyRows` of `PlanPages` (and the empty success of a batch of none)."""

    ids: tuple[int, ...] = ()
    short: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return not self.short


class DummyPages(Protocol):
    """What the capacity query and the warmup use of `KVCacheManager`."""

    @property
    def groups(self) -> Sequence[LayerGroup]: ...
    @property
    def limits(self) -> ServingLimits: ...
    def free_pages(self, group: str) -> int: ...
    def pool_of(self, group: str) -> str: ...
    def live_pages(self, rid: int, group: str) -> int: ...
    def add_dummy_requests(
        self, batch_size: int, token_num: int, draft_len: int = 0, is_gen: bool = True
    ) -> DummyRows: ...
    def reserve_padding_dummy(self, draft_len: int = 0) -> int | None: ...
    def free(self, rid: int) -> None: ...


def dummy_shape(token_num: int, draft_len: int, extra: int, is_gen: bool = True) -> tuple[int, int]:
    """(capacity, history) of a dummy request (rule 2)."""
    if is_gen:
        return token_num + draft_len + extra, token_num - 1
    return token_num + extra, 0


def shortfall(mgr: DummyPages, batch: Iterable[tuple[int, int]], copies: int = 1) -> dict[str, int]:
    """Pages missing per pool (a group's own, or a shared pool's name; only
    pools that lack pages) for `copies` new requests of each of the given
    (capacity, history) shapes, against the pages free now."""
    shapes = list(batch)
    short = {}
    for name, groups in groups_by_pool(mgr).items():
        need = copies * sum(pages_needed(g, c, h) for g in groups for c, h in shapes)
        free = mgr.free_pages(groups[0].name)
        if need > free:
            short[name] = need - free
    return short


def groups_by_pool(mgr: DummyPages) -> dict[str, list[LayerGroup]]:
    """The groups drawing from each pool, by pool name (`DummyPages.pool_of`)."""
    out: dict[str, list[LayerGroup]] = {}
    for g in mgr.groups:
        out.setdefault(mgr.pool_of(g.name), []).append(g)
    return out


def pages_of(groups: list[LayerGroup], capacity: int, history: int) -> int:
    """Pages one request of (capacity, history) needs in groups that share a pool."""
    return sum(pages_needed(g, capacity, history) for g in groups)


def _shared_max_generation_length(mgr: DummyPages, batch_size: int, draft_len: int) -> int:
    """`max_generation_length` when groups share a pool: their needs are summed.
    Between the longest that fits with every bounded group at its worst and the
    longest the growing groups alone allow, each length is tried from the top
    (a pool without a growing group whose worst case does not fit is scanned
    from `max_seq_len` down: slow, still exact)."""
    extra, headroom = mgr.limits.num_extra_kv_tokens, 1 + draft_len + mgr.limits.num_extra_kv_tokens
    short_c, short_h = dummy_shape(1, draft_len, extra)
    shared = groups_by_pool(mgr)
    free = {
        k: mgr.free_pages(gs[0].name) - (batch_size - 1) * pages_of(gs, short_c, short_h) for k, gs in shared.items()
    }
    growing = {k: [g for g in gs if decode_worst_case_pages(g, headroom) is None] for k, gs in shared.items()}
    worst = {k: sum(decode_worst_case_pages(g, headroom) or 0 for g in gs) for k, gs in shared.items()}

    def fits(groups: dict[str, list[LayerGroup]], token_num: int, slack: dict[str, int] | None = None) -> bool:
        c, h = dummy_shape(token_num, draft_len, extra)
        return all(
            sum(pages_needed(g, c, h) for g in gs) + (slack or {}).get(k, 0) <= free[k] for k, gs in groups.items()
        )

    top = largest_fitting(1, mgr.limits.max_seq_len, lambda n: fits(growing, n))
    low = largest_fitting(1, top, lambda n: fits(growing, n, worst))
    for token_num in range(top, low, -1):
        if fits(shared, token_num):
            return token_num
    return max(0, low)


def max_generation_length(mgr: DummyPages, batch_size: int, draft_len: int = 0) -> int:
    """Largest `token_num` of the longest row of a decode batch of `batch_size`
    whose other rows are minimal decodes (token_num 1), given the pages free
    now; 0 if even token_num 1 does not fit. Capped at `limits.max_seq_len`: a
    sequence never holds more tokens than that (its drafts and extra KV tokens
    get capacity beyond it, as they do in a real step).

    Page-exact: `add_dummy_requests(batch_size - 1, 1, d)` plus
    `add_dummy_requests(1, answer, d)` succeeds, and the answer plus one page
    does not fit unless the cap bound it. Groups whose need grows with length
    (full, compressed) are bisected; groups with a bounded need (sliding,
    chunked, state) are then checked downward from there, since their need
    rises and falls with the offset inside a page or chunk.
    """
    if any(mgr.pool_of(g.name) != g.name for g in mgr.groups):
        return _shared_max_generation_length(mgr, batch_size, draft_len)
    extra = mgr.limits.num_extra_kv_tokens
    short_c, short_h = dummy_shape(1, draft_len, extra)
    free = {g.name: mgr.free_pages(g.name) - (batch_size - 1) * pages_needed(g, short_c, short_h) for g in mgr.groups}
    headroom = 1 + draft_len + extra
    growing = [g for g in mgr.groups if decode_worst_case_pages(g, headroom) is None]
    bounded = [g for g in mgr.groups if g not in growing]

    def fits(groups: Iterable[Any], token_num: int) -> bool:
        c, h = dummy_shape(token_num, draft_len, extra)
        return all(pages_needed(g, c, h) <= free[g.name] for g in groups)

    lo = largest_fitting(1, mgr.limits.max_seq_len, lambda n: fits(growing, n))
    if lo < 1:
        return 0
    bounded_fit = [g for g in bounded if (decode_worst_case_pages(g, headroom) or 0) <= free[g.name]]
    rest = [g for g in bounded if g not in bounded_fit]
    if not rest or fits(rest, lo):
        return lo
    # A bounded group's need repeats with a period once its window is full
    # and only grows with length before any page is stale (`KindRule.need_period`:
    # tpb from W on and up to W + tpb - 1 for sliding(W), lcm(C, tpb) and C for chunked(C)).
    # So: scan one period below `lo` where every group repeats (nothing there
    # means nothing longer fits either), then the stretch between the two
    # regions, then bisect. Fast at million-token limits, exact everywhere.
    period, periodic_from, monotone_to = 1, 1, lo
    for g in rest:
        p, since, until = g.rule.need_period(g)
        period = math.lcm(period, p)
        periodic_from = max(periodic_from, since)
        monotone_to = min(monotone_to, until)
    top = lo - 1
    if lo - period >= periodic_from:
        for token_num in range(top, lo - period, -1):
            if fits(rest, token_num):
                return token_num
        top = periodic_from - 1
    for token_num in range(top, monotone_to, -1):
        if fits(rest, token_num):
            return token_num
    return max(0, largest_fitting(1, min(top, monotone_to), lambda n: fits(rest, n)))


@dataclass(frozen=True)
class SkippedShape:
    """A (batch size, draft length) warmup shape that did not fit: `group`
    lacked `short_pages` pages."""

    batch_size: int
    draft_len: int
    group: str
    short_pages: int


@dataclass(frozen=True)
class WarmupReport:
    """Result of `KVCacheManager.warmup`.

    `captured`: (batch size, draft length) shapes whose dummies all fit;
    `lengths[(b, d)]`: the token_num of the longest dummy of a captured shape;
    `skipped`: the shapes that did not fit and why; `padding`: draft length ->
    id of the persistent padding dummy (a minimal generation dummy kept
    allocated; pad a decode batch by repeating that id) or None when none is
    needed (every batch size 1..B captured) or it could not be reserved (then
    `padding_short[d]` says which group lacked pages); `reserved_pages`: pages those dummies hold per group;
    `unfit`: the other warmup shapes (`warmup_context`, `warmup_batch`) that did
    not fit, with the pages short per group (empty when all fitted).
    """

    captured: list[tuple[int, int]]
    skipped: list[SkippedShape]
    lengths: dict[tuple[int, int], int]
    padding: dict[int, int | None]
    reserved_pages: dict[str, int]
    padding_short: dict[int, dict[str, int]] = field(default_factory=dict)
    unfit: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "captured": [[b, d] for b, d in self.captured],
            "skipped": [vars(s).copy() for s in self.skipped],
            "reserved_pages": dict(self.reserved_pages),
            "padding": {str(d): rid for d, rid in self.padding.items()},
            "lengths": [[b, d, t] for (b, d), t in self.lengths.items()],
            "unfit": {k: dict(v) for k, v in self.unfit.items()},
        }


def _worst(short: dict[str, int]) -> tuple[str, int]:
    """The group missing the most pages."""
    if not short:
        return "", 0
    name = max(short, key=lambda k: short[k])
    return name, short[name]


def try_shape(mgr: DummyPages, batch_size: int, token_num: int, draft_len: int, is_gen: bool) -> dict[str, int]:
    """Allocate `batch_size` dummies of one shape and free them again: {} when
    they fit, else the pages short per group (nothing stays allocated)."""
    rows = mgr.add_dummy_requests(batch_size, token_num, draft_len, is_gen=is_gen)
    for rid in rows.ids:
        mgr.free(rid)
    return {} if rows else dict(rows.short)


def warmup(mgr: DummyPages, batch_sizes: Iterable[int], draft_lens: Iterable[int] = (0,)) -> WarmupReport:
    """Dry-run warmup, in the order an engine runs it: the context dummy (N
    prompt tokens, the first generated token and the largest draft), the
    general batch of B minimal decodes, then for each CUDA-graph shape (b, d)
    b - 1 minimal generation dummies plus one of `max_generation_length`; each
    freed before the next. Then keep one padding dummy per draft length (a
    reservation counted in the pools). These are the shapes the profile plan
    holds (`kvpool.plan.warmup_constraints`)."""
    captured, skipped, lengths = [], [], {}
    drafts = sorted(set(draft_lens))
    limits = mgr.limits
    extra = limits.num_extra_kv_tokens
    unfit = {}
    top = max(drafts, default=0)
    # a context dummy has capacity token_num + E: N, its first generated token, d drafts
    if limits.max_num_tokens is not None and (short := try_shape(mgr, 1, limits.max_num_tokens + 1 + top, 0, False)):
        unfit["warmup_context"] = short
    if short := try_shape(mgr, limits.max_batch_size, 1, top, True):
        unfit["warmup_batch"] = short
    for d in drafts:
        for b in sorted(set(batch_sizes)):
            short_rows = mgr.add_dummy_requests(b - 1, 1, d) if b > 1 else Rows()
            if not short_rows:
                group, pages = _worst(shortfall(mgr, [dummy_shape(1, d, extra)] * b))
                skipped.append(SkippedShape(b, d, group, pages))
                continue
            taken = list(short_rows.ids)
            longest = max_generation_length(mgr, 1, d)
            if longest == 0:
                group, pages = _worst(shortfall(mgr, [dummy_shape(1, d, extra)]))
                skipped.append(SkippedShape(b, d, group, pages))
            else:
                long_row = mgr.add_dummy_requests(1, longest, d)
                if not long_row:  # the query promised this fits
                    raise OutOfPagesError(
                        f"warmup dummy of {longest} tokens (batch {b}, draft {d}) did not fit "
                        f"although max_generation_length allowed it; short: {dict(long_row.short)}"
                    )
                captured.append((b, d))
                lengths[(b, d)] = longest
                taken += long_row.ids
            for rid in taken:
                mgr.free(rid)
    padding: dict[int, int | None] = {}
    padding_short = {}
    every_size = set(range(1, mgr.limits.max_batch_size + 1))
    for d in drafts:
        if {b for b, dd in captured if dd == d} >= every_size:
            padding[d] = None  # every batch size has its own graph: nothing is ever padded
            continue
        padding[d] = mgr.reserve_padding_dummy(d)
        if padding[d] is None:
            padding_short[d] = shortfall(mgr, [dummy_shape(1, d, extra)])
    reserved = {g.name: sum(mgr.live_pages(r, g.name) for r in padding.values() if r is not None) for g in mgr.groups}
    return WarmupReport(captured, skipped, lengths, padding, reserved, padding_short, unfit)
