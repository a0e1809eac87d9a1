"""The exact decode worst case of bounded groups, against a brute-force count
of the pages each position touches (independent of kvpool.spec.pages)."""

from __future__ import annotations

from math import lcm

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.spec import decode_worst_case_pages, pages_needed
from plan_helpers import group


def live_pages_brute(kind: str, window: int, tpb: int, capacity: int, history: int) -> int:
    """Pages that hold at least one position the in-flight token still reads.

    sliding(W): the token at position `history` reads positions from
    history + 1 - W on; chunked(C): from the start of its chunk on. Every
    position up to capacity - 1 has a slot."""
    start = max(0, history + 1 - window) if kind == "sliding" else (history // window) * window
    return len({p // tpb for p in range(start, capacity)})


def worst_case_brute(kind: str, window: int, tpb: int, headroom: int) -> int:
    """Max over every history (all offsets of the window start within a page,
    over a whole period of the pattern) of the live pages of a decode whose
    capacity leads its history by `headroom`."""
    period = lcm(window, tpb) + window + headroom + 3 * tpb
    return max(live_pages_brute(kind, window, tpb, h + headroom, h) for h in range(period))


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["sliding", "chunked"]),
    tpb=st.sampled_from([1, 2, 3, 4, 8, 16, 32]),
    window=st.integers(1, 200),
    headroom=st.integers(1, 12),
)
def test_decode_worst_case_equals_brute_force_over_all_offsets(kind: str, tpb: int, window: int, headroom: int) -> None:
    g = group("g", kind, tpb=tpb, window=window)
    brute = worst_case_brute(kind, window, tpb, headroom)
    got = decode_worst_case_pages(g, headroom)
    assert got == brute, f"{kind} W={window} tpb={tpb} headroom={headroom}: {got} != brute {brute}"


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["sliding", "chunked"]),
    tpb=st.sampled_from([1, 4, 16, 32]),
    window=st.integers(1, 300),
    history=st.integers(0, 3000),
    lead=st.integers(1, 40),
)
def test_pages_needed_equals_brute_force_count(kind: str, tpb: int, window: int, history: int, lead: int) -> None:
    g = group("g", kind, tpb=tpb, window=window)
    brute = live_pages_brute(kind, window, tpb, history + lead, history)
    assert pages_needed(g, history + lead, history) == brute


def test_textbook_bound_overcounts_only_when_remainder_is_one() -> None:
    # W = 33, tpb = 32, headroom 1: x = W + headroom - 1 = 33, x mod 32 = 1.
    # Textbook bound ceil(33/32) + 1 = 3; but 33 live positions starting at
    # offset r <= 31 span at most ceil((31 + 33)/32) = 2 pages.
    g = group("g", "sliding", tpb=32, window=33)
    assert decode_worst_case_pages(g, 1) == 2 == worst_case_brute("sliding", 33, 32, 1)
    # W = 1024, tpb = 32: x = 1024 (mod 32 = 0): ceil(1024/32) + 1 = 33 pages;
    # with MTP headroom 4: ceil(1027/32) + 1 = 34 (research note §3).
    w = group("w", "sliding", tpb=32, window=1024)
    assert decode_worst_case_pages(w, 1) == 33
    assert decode_worst_case_pages(w, 4) == 34
