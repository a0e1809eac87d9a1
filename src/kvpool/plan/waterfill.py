"""Split a byte budget into whole pages per group by a ratio, with floors.

Exact rational arithmetic (`Fraction`), so that the total can never creep over
the budget through float rounding (docs/design.md, rule 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def waterfill(budget: int, slot_bytes: Sequence[int], ratio: Sequence[float], floors: Sequence[int]) -> list[int]:
    """Pages per group: each group's byte share of `budget` follows `ratio`, no
    group gets fewer than its floor, and `sum(pages * slot_bytes) <= budget`.

    1. A group whose ratio share is below its floor is pinned at the floor and
       the rest of the budget is re-split among the others, until none is below.
    2. Each free group takes the whole pages its share buys.
    3. Leftover bytes go, by ratio, to the groups that can still take a page;
       when every such share is under one page, the group furthest below its
       target takes one page. Repeats until no group's page fits.

    The caller checks feasibility first: raises ValueError if the floors alone
    exceed the budget.
    """
    n = len(slot_bytes)
    if not (len(ratio) == len(floors) == n):
        raise ValueError("slot_bytes, ratio and floors must have one entry per group")
    if any(s <= 0 for s in slot_bytes) or any(r < 0 for r in ratio) or any(f < 0 for f in floors):
        raise ValueError("slot bytes must be positive, ratios and floors non-negative")
    floor_bytes = sum(f * s for f, s in zip(floors, slot_bytes, strict=True))
    if floor_bytes > budget:
        raise ValueError(f"floors need {floor_bytes} bytes, more than the budget {budget}")
    weights = [Fraction(r) for r in ratio]
    if sum(weights) == 0:
        weights = [Fraction(1)] * n
    pages = list(floors)
    free = {i for i in range(n) if weights[i] > 0}
    while free:
        spare = budget - sum(pages[i] * slot_bytes[i] for i in range(n) if i not in free)
        total_w = sum(weights[i] for i in free)
        share = {i: spare * weights[i] / total_w for i in free}
        pinned = {i for i in free if share[i] < floors[i] * slot_bytes[i]}
        if not pinned:
            for i in free:
                pages[i] = int(share[i] // slot_bytes[i])
            break
        free -= pinned
    _spread_leftover(budget, slot_bytes, weights, pages)
    return pages


def _spread_leftover(budget: int, slot_bytes: Sequence[int], weights: list[Fraction], pages: list[int]) -> None:
    """Give the bytes left after flooring to groups that can still take a page."""
    n = len(slot_bytes)
    total_w = sum(weights)
    target = [budget * w / total_w for w in weights]
    while True:
        left = budget - sum(p * s for p, s in zip(pages, slot_bytes, strict=True))
        takers = [i for i in range(n) if slot_bytes[i] <= left]
        if not takers:
            return
        adds = _shares_of(left, takers, weights, slot_bytes)
        if any(adds.values()):
            for i, k in adds.items():
                pages[i] += k
        else:
            neediest = max(takers, key=lambda i: (target[i] - pages[i] * slot_bytes[i], -i))
            pages[neediest] += 1


def _shares_of(left: int, takers: list[int], weights: list[Fraction], slot_bytes: Sequence[int]) -> dict[int, int]:
    """Whole pages of `left` bytes for each taker, by its weight among the takers."""
    taker_w = sum(weights[i] for i in takers)
    return {i: int(left * weights[i] / taker_w // slot_bytes[i]) if taker_w else 0 for i in takers}
