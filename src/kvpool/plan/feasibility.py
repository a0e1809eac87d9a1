"""Floors from constraints, and what to say when they do not fit the budget.

Floors never inflate the budget (docs/design.md, rule 3): a constraint that does not fit
raises `InfeasiblePlanError` naming the constraint, the group it pushes
hardest, the pages short there and the largest B and L that would fit; or, with
`fit=True`, its longest request is shrunk (capacity and history together) to
the longest that fits.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from kvpool.errors import InfeasiblePlanError
from kvpool.plan.batches import Constraint
from kvpool.plan.limits import ServingLimits
from kvpool.plan.result import ConstraintResult
from kvpool.spec import ModelSpec, Shape, pages_needed
from kvpool.units import format_bytes

ConstraintBuilder = Callable[[ServingLimits], Sequence[Constraint]]


def pages_bytes(spec: ModelSpec, pages: Mapping[str, int]) -> int:
    """Bytes of `pages` slots per group."""
    return sum(g.slot_bytes * pages.get(g.name, 0) for g in spec.groups)


def batch_floors(spec: ModelSpec, batch: Sequence[Shape]) -> dict[str, int]:
    """Pages per group that `batch` needs at once; equal shapes are counted once
    and multiplied (warmup batches repeat one shape hundreds of times)."""
    runs = Counter(batch)
    return {g.name: sum(n * pages_needed(g, s.capacity, s.history) for s, n in runs.items()) for g in spec.groups}


def merge_floors(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Element-wise max of two page floors."""
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in {*a, *b}}


def base_floors(spec: ModelSpec) -> dict[str, int]:
    """One page per group: a pool with no slot serves no request."""
    return {g.name: 1 for g in spec.groups}


def floors_fit(spec: ModelSpec, constraints: Sequence[Constraint], budget: int) -> bool:
    """Whether every constraint's pages (and one page per group) fit `budget` together."""
    floors = base_floors(spec)
    for c in constraints:
        floors = merge_floors(floors, batch_floors(spec, c.batch))
    return pages_bytes(spec, floors) <= budget


def largest_fitting(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """Largest x in [lo, hi] with fits(x), for fits monotone (true up to some
    point, false after); lo - 1 if none."""
    if hi < lo or not fits(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_fitting_length(lo: int, hi: int, tpb: int, fits: Callable[[int], bool], *, lead: int = 0) -> int:
    """Largest request length x in [lo, hi] with fits(x); lo - 1 if none.
    The shapes tested for x end at capacity `x + lead` (a decode's drafts and
    extra KV tokens lie past its length).

    Page needs are not monotone in the length: a decode one position past a
    page boundary can hold one more sliding page than one exactly at the
    boundary, so bisection alone can miss the answer. They are monotone over
    lengths whose capacity is page-aligned (a shift by tpb shifts the window by
    whole pages), and no length inside such a page needs fewer pages than its
    aligned start. So: bisect over the aligned lengths, then scan down the page
    above the last fitting one. Exact for full, sliding, compressed and state
    groups.
    """
    if hi < lo:
        return lo - 1
    k_lo, k_hi = -(-(lo + lead) // tpb), (hi + lead) // tpb
    k = largest_fitting(k_lo, k_hi, lambda j: fits(j * tpb - lead)) if k_lo <= k_hi else k_lo - 1
    top = min(hi, (k + 1) * tpb - 1 - lead)
    bottom = max(lo, k * tpb - lead)
    for x in range(top, bottom - 1, -1):
        if fits(x):
            return x
    return lo - 1


def resolve_floors(
    spec: ModelSpec,
    limits: ServingLimits,
    budget: int,
    build: ConstraintBuilder,
    *,
    fit: bool = False,
) -> tuple[dict[str, int], tuple[ConstraintResult, ...], tuple[str, ...]]:
    """Page floors per group for the constraints `build(limits)`, checked in order.

    Returns (floors, constraint results, notes on what was shrunk). Raises
    `InfeasiblePlanError` for the first constraint that does not fit (after
    shrinking, with `fit=True`). Side-effect free.
    """
    floors = base_floors(spec)
    if (needed := pages_bytes(spec, floors)) > budget:
        # the shortfall in pages of the largest group (the one the message names):
        # enough of them to cover every byte missing, not always 1
        big = max(spec.groups, key=lambda g: g.slot_bytes)
        excess = needed - budget
        short = -(-excess // big.slot_bytes)
        raise InfeasiblePlanError(
            f"budget {format_bytes(budget)} cannot hold one page of every group "
            f"({format_bytes(needed)} needed): group '{big.name}' is {short} pages "
            f"({format_bytes(excess)}) short",
            constraint="one_page_per_group",
            group=big.name,
            short_pages=short,
        )
    results: list[ConstraintResult] = []
    notes: list[str] = []
    for c in build(limits):
        merged = merge_floors(floors, batch_floors(spec, c.batch))
        if pages_bytes(spec, merged) <= budget:
            floors = merged
            results.append(ConstraintResult(c.name, c.batch, True))
            continue
        shrunk = shrink_longest(spec, c, floors, budget) if fit else None
        if shrunk is None:
            raise infeasible(spec, limits, budget, build, c, floors, merged, fit=fit)
        longest = max(c.batch, key=lambda s: s.capacity)
        new_longest = max(shrunk, key=lambda s: s.capacity)
        floors = merge_floors(floors, batch_floors(spec, shrunk))
        results.append(ConstraintResult(c.name, shrunk, True, shrunk_from=longest))
        notes.append(
            f"fit: constraint '{c.name}' longest request shrunk from capacity {longest.capacity} "
            f"(history {longest.history}) to {new_longest.capacity} (history {new_longest.history})"
        )
    return floors, tuple(results), tuple(notes)


def shrink_longest(
    spec: ModelSpec, constraint: Constraint, floors: Mapping[str, int], budget: int
) -> tuple[Shape, ...] | None:
    """The constraint's batch with its longest request shrunk, capacity and
    history together (their gap kept), to the longest that fits next to
    `floors`; None if even `max(1, gap)` positions do not fit."""
    batch = constraint.batch
    index = max(range(len(batch)), key=lambda i: (batch[i].capacity, -i))
    longest = batch[index]
    gap = longest.capacity - longest.history

    def with_capacity(cap: int) -> tuple[Shape, ...]:
        return batch[:index] + (Shape(cap, cap - gap),) + batch[index + 1 :]

    def fits(cap: int) -> bool:
        merged = merge_floors(floors, batch_floors(spec, with_capacity(cap)))
        return pages_bytes(spec, merged) <= budget

    lo = max(1, gap)
    best = largest_fitting_length(lo, longest.capacity, spec.tokens_per_block, fits)
    return with_capacity(best) if best >= lo else None


def infeasible(
    spec: ModelSpec,
    limits: ServingLimits,
    budget: int,
    build: ConstraintBuilder,
    constraint: Constraint,
    floors: Mapping[str, int],
    merged: Mapping[str, int],
    *,
    fit: bool,
) -> InfeasiblePlanError:
    """The error for `constraint` not fitting on top of `floors`: the group it
    grows most (in bytes), the pages of that group the budget lacks, and the
    largest B and L (others unchanged) whose constraints all fit."""
    excess = pages_bytes(spec, merged) - budget
    group = max(spec.groups, key=lambda g: (merged[g.name] - floors.get(g.name, 0)) * g.slot_bytes)
    short = -(-excess // group.slot_bytes)

    def fits_with(**change: int) -> bool:
        changed = limits.clamped(**change)
        return floors_fit(spec, build(changed), budget)

    best_b = largest_fitting(1, limits.max_batch_size, lambda b: fits_with(max_batch_size=b))
    best_l = largest_fitting_length(
        1,
        limits.max_seq_len,
        spec.tokens_per_block,
        lambda n: fits_with(max_seq_len=n),
        lead=limits.max_draft_len + limits.num_extra_kv_tokens,  # longest decodes end at L + d + E
    )
    best_n = 0
    if limits.max_num_tokens is not None:  # the context constraint grows with N
        best_n = max(
            0,
            largest_fitting(
                1,
                limits.max_num_tokens,
                lambda n: floors_fit(spec, build(dataclasses.replace(limits, max_num_tokens=n)), budget),
            ),
        )
    what = ", ".join(f"{n}x{s.capacity}/{s.history}" for s, n in _runs(constraint.batch))
    hints = [
        f"largest max_batch_size that fits: {best_b or 'none'}",
        f"largest max_seq_len that fits: {best_l or 'none'}",
    ]
    if limits.max_num_tokens is not None:
        hints.append(f"largest max_num_tokens that fits: {best_n or 'none'}")
    # offer --fit only where shrinking the longest request would find an answer
    if not fit and shrink_longest(spec, constraint, floors, budget) is not None:
        hints.append("or pass --fit to shrink its longest request")
    return InfeasiblePlanError(
        f"budget {format_bytes(budget)} cannot hold constraint '{constraint.name}' "
        f"[{what} capacity/history]: group '{group.name}' is {short} pages "
        f"({format_bytes(excess)}) short; {'; '.join(hints)}",
        constraint=constraint.name,
        group=group.name,
        short_pages=short,
        max_batch_size=max(best_b, 0),
        max_seq_len=max(best_l, 0),
        max_num_tokens=best_n,
    )


def _runs(batch: Sequence[Shape]) -> list[tuple[Shape, int]]:
    """Consecutive equal shapes as (shape, count), for a short description."""
    out: list[tuple[Shape, int]] = []
    for s in batch:
        if out and out[-1][0] == s:
            out[-1] = (s, out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out
