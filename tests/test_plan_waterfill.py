"""Water-filling whole pages by ratio with floors, never past the budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.plan import waterfill


def total(pages: list[int], slots: list[int]) -> int:
    return sum(p * s for p, s in zip(pages, slots, strict=True))


def test_ratio_split_in_whole_pages() -> None:
    # 1000 B, slots 10 and 30, ratio 1:1 -> 500 B each: 50 pages of 10, 16 pages
    # of 30 (480 B). Leftover 20 B: only the 10-byte group can take a page
    # (2 more). Total 520 + 480 = 1000.
    assert waterfill(1000, [10, 30], [0.5, 0.5], [0, 0]) == [52, 16]


def test_floor_pins_a_group_and_the_rest_is_reshared() -> None:
    # Ratio 0.9:0.1 of 1000 B gives the second group 100 B = 10 pages, below its
    # floor of 30 pages (300 B). Pinned at 30; the first gets 700 B = 70 pages.
    assert waterfill(1000, [10, 10], [0.9, 0.1], [0, 30]) == [70, 30]


def test_floors_that_exceed_the_budget_are_refused() -> None:
    with pytest.raises(ValueError, match="floors need 1100 bytes"):
        waterfill(1000, [10, 100], [0.5, 0.5], [10, 10])


def test_a_page_larger_than_the_budget_share_gets_nothing_but_the_floor() -> None:
    # 100 B, slots 60 and 1: ratio 0.5 gives the big group 50 B, not a page; the
    # small group takes 50, then the 50 B left over go to the only taker.
    assert waterfill(100, [60, 1], [0.5, 0.5], [0, 0]) == [0, 100]


def assert_valid_fill(budget: int, slots: list[int], ratio: list[float], floors: list[int], pages: list[int]) -> None:
    used = total(pages, slots)
    assert used <= budget, f"{pages} x {slots} = {used} > {budget}"
    assert all(p >= f for p, f in zip(pages, floors, strict=True)), f"{pages} below floors {floors}"
    assert all(s > budget - used for s in slots), (
        f"{budget - used} B left over although a slot of {min(slots)} B would fit: {pages}"
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 6))
def test_fill_respects_budget_floors_and_leaves_no_usable_bytes(data: st.DataObject, n: int) -> None:
    slots = data.draw(st.lists(st.integers(1, 10**7), min_size=n, max_size=n))
    ratio = data.draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))
    floors = data.draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    budget = total(floors, slots) + data.draw(st.integers(0, 10**10))
    pages = waterfill(budget, slots, ratio, floors)
    assert_valid_fill(budget, slots, ratio, floors, pages)


@settings(max_examples=100, deadline=None)
@given(slots=st.lists(st.integers(1, 4096), min_size=2, max_size=5), budget=st.integers(10**6, 10**9))
def test_without_floors_each_group_is_within_one_ratio_round_of_its_share(slots: list[int], budget: int) -> None:
    ratio = [1 / len(slots)] * len(slots)
    pages = waterfill(budget, slots, ratio, [0] * len(slots))
    for p, s in zip(pages, slots, strict=True):
        # Its share buys floor(budget / n / s) pages; leftovers are under one
        # page per group, so it gains at most sum(slots) / s more.
        assert budget // len(slots) // s <= p <= budget // len(slots) // s + sum(slots) // s + 1
