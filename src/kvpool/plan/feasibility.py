"""Floors from constraints and guarantees, and the searches for the largest
limit whose floors fit.

Floors never inflate the budget (docs/design.md, rule 3): `resolve_floors`
stops at the first hard constraint that does not fit (the caller raises
`InfeasiblePlanError` with what would fit, `plan.advice`) and pins a guarantee
only where the budget holds it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from kvpool.errors import InfeasiblePlanError
from kvpool.plan.batches import Constraint
from kvpool.plan.result import ConstraintResult
from kvpool.spec import ModelSpec, Shape, pages_needed
from kvpool.units import format_bytes


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


class Floors(NamedTuple):
    """What the floors of a plan come to (`resolve_floors`): pages per group,
    the hard constraints that fit (in order), the guarantees not already held
    by them and which of those the budget also holds (`pinned`), and the first
    hard constraint that does not fit (`failed`: it, the floors before it, and
    the floors with it) or None."""

    pages: dict[str, int]
    results: tuple[ConstraintResult, ...]
    kept: tuple[Constraint, ...]
    pinned: frozenset[str]
    failed: tuple[Constraint, dict[str, int], dict[str, int]] | None


def check_one_page_each(spec: ModelSpec, budget: int) -> None:
    """Raises `InfeasiblePlanError` when `budget` cannot hold one page of every group."""
    needed = pages_bytes(spec, base_floors(spec))
    if needed <= budget:
        return
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


def resolve_floors(
    spec: ModelSpec, budget: int, hard: Sequence[Constraint], soft: Sequence[Constraint] = (), *, pin: bool = True
) -> Floors:
    """Page floors per group: one page each, then every hard constraint in order
    (stopping at the first that does not fit: `Floors.failed`), then each soft
    one (a guarantee) that the hard floors do not already hold, pinned when it
    fits on top (with `pin`). Side-effect free; never exceeds `budget` with
    what it pins."""
    floors = base_floors(spec)
    results: list[ConstraintResult] = []
    for c in hard:
        merged = merge_floors(floors, batch_floors(spec, c.batch))
        if pages_bytes(spec, merged) > budget:
            return Floors(floors, tuple(results), (), frozenset(), (c, floors, merged))
        floors = merged
        results.append(ConstraintResult(c.name, c.batch, True))
    hard_floors, kept, pinned = floors, [], set()
    for c in soft:
        need = batch_floors(spec, c.batch)
        if all(need[k] <= hard_floors[k] for k in need):
            continue  # a hard constraint already holds it
        kept.append(c)
        merged = merge_floors(floors, need)
        if pin and pages_bytes(spec, merged) <= budget:
            floors = merged
            pinned.add(c.name)
    return Floors(floors, tuple(results), tuple(kept), frozenset(pinned), None)


def shortfall(
    spec: ModelSpec, budget: int, constraint: Constraint, floors: Mapping[str, int], merged: Mapping[str, int]
) -> tuple[str, int, int]:
    """(group, pages short, bytes short) of `constraint` on top of `floors`: the
    group it grows most in bytes, and enough of its pages to cover every byte
    missing."""
    excess = pages_bytes(spec, merged) - budget
    group = max(spec.groups, key=lambda g: (merged[g.name] - floors.get(g.name, 0)) * g.slot_bytes)
    return group.name, -(-excess // group.slot_bytes), excess


def describe_batch(batch: Sequence[Shape]) -> str:
    """`1x8193/0, 15x1/0`: runs of equal (capacity/history) shapes."""
    return ", ".join(f"{n}x{s.capacity}/{s.history}" for s, n in _runs(batch))


def _runs(batch: Sequence[Shape]) -> list[tuple[Shape, int]]:
    """Consecutive equal shapes as (shape, count), for a short description."""
    out: list[tuple[Shape, int]] = []
    for s in batch:
        if out and out[-1][0] == s:
            out[-1] = (s, out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out
