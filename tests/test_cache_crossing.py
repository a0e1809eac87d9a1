"""The decode crossing (`PageTables.cross`, cache/tables.py), the
move's early return, against the general planner (`plan` / `shortfall` /
`apply`) on batches: the same answers, the same pages in the same table
entries, the same owners, hashes, free stacks, LRU order and events."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, manager, observed, twin_spec
from kvpool.cache import KVCacheManager, tables
from kvpool.cache.tables import PageTables
from kvpool.spec.pages import stale_pages

TPB, WINDOW, BATCH = 4, 10, 5
PROMPTS = [list(range(100 * i, 100 * i + 9 + i)) for i in range(BATCH)]


def planner_only(m: KVCacheManager) -> KVCacheManager:
    """`m` with the crossing's early return turned off: every move is planned."""
    m.tables.crossable = False
    return m


# each step: which requests move, how far (tokens), and then "x" nothing more, "c" commit their ids
# (their whole pages become reusable) or "f" free the first and admit it again (its committed pages
# wait in the LRU, and a pool whose free stack runs dry evicts them for the pages a crossing takes)
steps = st.lists(
    st.tuples(st.sets(st.integers(0, BATCH - 1), min_size=1), st.integers(1, TPB + 1), st.sampled_from("xcf")),
    min_size=1,
    max_size=40,
)


def admit(m: KVCacheManager, rid: int) -> int:
    """Admit request `rid` with its prompt, prefilled (history at its end); the prefix hit."""
    prompt = PROMPTS[rid]
    hit = m.create(rid, prompt)
    assert m.resize(rid, len(prompt), len(prompt))
    return hit


@settings(max_examples=120, deadline=None)
@given(
    steps=steps,
    sliding=st.booleans(),
    reuse=st.booleans(),
    full_pages=st.integers(20, 44),
    sliding_pages=st.integers(20, 34),
)
def test_a_batch_crossing_moves_the_pages_the_planner_moves(
    steps: list[tuple[set[int], int, str]], sliding: bool, reuse: bool, full_pages: int, sliding_pages: int
) -> None:
    spec = twin_spec(tpb=TPB, window=WINDOW) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": sliding_pages} if sliding else {"full": full_pages}
    fast, slow = manager(spec, pages, reuse=reuse), planner_only(manager(spec, pages, reuse=reuse))
    known: dict[int, int] = {}
    for rid, prompt in enumerate(PROMPTS):  # admitted and prefilled, windows already sliding
        assert admit(fast, rid) == admit(slow, rid)
        known[rid] = len(prompt)
    for movers, n, then in steps:
        rids = sorted(r for r in movers if r in known)  # (a request freed and not admitted again is gone)
        if not rids or any(fast.capacity(r) + n > fast.max_capacity for r in rids):
            continue
        a, b = fast.extend(rids, n), slow.extend(rids, n)
        assert (bool(a), a.short) == (bool(b), b.short)
        if then == "c" and reuse and a:
            for rid in rids:  # the generated ids so far, then every whole page is offered for reuse
                hist = fast.history(rid)
                new = [10_000 + rid * 1_000 + i for i in range(known[rid], hist)]
                known[rid] = max(known[rid], hist)
                assert fast.commit(rid, hist, new) == slow.commit(rid, hist, new)
        elif then == "f":
            fast.free(rids[0])
            slow.free(rids[0])
            if fast.free_pages("full") >= 4 and (not sliding or fast.free_pages("sliding") >= 4):
                assert admit(fast, rids[0]) == admit(slow, rids[0])
                known[rids[0]] = len(PROMPTS[rids[0]])
            else:  # no room to admit it again: the rest of the steps leave it out
                del known[rids[0]]
        assert fast.take_events() == slow.take_events()
        assert observed(fast) == observed(slow)
        fast.check_integrity()  # the crossing's bounds and stale histories are rebound's and next_stale's
    assert fast.stats() == slow.stats()
    fast.check_integrity()
    slow.check_integrity()


def test_a_batch_of_decode_steps_takes_the_crossing() -> None:
    # the property above is not vacuous: 5 requests decoding one token a step cross together
    # (the prompts end on different offsets within a page, so some steps cross a few rows at once)
    m = manager(twin_spec(tpb=TPB, window=WINDOW), {"full": 60, "sliding": 30}, reuse=False)
    rows_crossed: list[int] = []
    real_cross = PageTables.cross

    def counting_cross(self: PageTables, rows: Any) -> bool:
        crossed = real_cross(self, rows)
        if crossed:
            rows_crossed.append(len(rows))
        return crossed

    m.tables.cross = counting_cross.__get__(m.tables)  # type: ignore[method-assign]
    rids = list(range(BATCH))
    for rid in rids:
        m.create(rid)
        assert m.resize(rid, 9 + rid, 8 + rid)
    for _ in range(3 * TPB):
        assert m.extend(rids, 1)
    assert rows_crossed and max(rows_crossed) > 1
    # each request crossed every page boundary once: ceil(cap / TPB) entries gained since 9 + rid
    gained = sum(-(-(9 + r + 3 * TPB) // TPB) - -(-(9 + r) // TPB) for r in rids)
    assert sum(rows_crossed) >= gained
    m.check_integrity()


@pytest.mark.parametrize("remembered", [1, 2, tables.STALE_STEPS])
def test_the_remembered_stale_steps_are_the_rule_s(monkeypatch: pytest.MonkeyPatch, remembered: int) -> None:
    # a sliding window's decode: each step's (stale pages, next history where it grows) comes from
    # `stale_step`, remembered per history; with room for 1 or 2 histories the memory is cleared
    # between the crossing's check and its move, and the tables still match the planner's
    monkeypatch.setattr(tables, "STALE_STEPS", remembered)
    spec = twin_spec(tpb=TPB, window=WINDOW)
    pages = {"full": 80, "sliding": 30}
    fast, slow = manager(spec, pages, reuse=False), planner_only(manager(spec, pages, reuse=False))
    rids = list(range(BATCH))
    for m in (fast, slow):
        for rid in rids:
            m.create(rid)
            assert m.resize(rid, 9 + rid, 8 + rid)
    for _ in range(6 * TPB):
        assert fast.extend(rids, 1) and slow.extend(rids, 1)
        assert observed(fast) == observed(slow)
    sliding = fast.groups[1]
    for hist, (now, nxt) in fast.tables.stale_steps[1].items():
        assert now == stale_pages(sliding, hist) == stale_pages(sliding, nxt - 1) < stale_pages(sliding, nxt)
    assert 0 < len(fast.tables.stale_steps[1]) <= remembered
    fast.check_integrity()


def test_a_batch_counts_the_prefix_lookups_of_its_requests_once_it_moves() -> None:
    # request 1 stores 4 whole pages of its 70-token prompt; requests 2 and 3 hit them (64 tokens each).
    # A refused batch counts neither lookup; a batch that moves counts both, the one whose shape stays
    # (an early return) included, and only once
    m = manager(full_spec(tpb=16), {"full": 12})
    prompt = list(range(500, 570))
    m.create(1, prompt)
    assert m.resize(1, 71, 70)
    m.commit(1, 70)
    assert m.create(2, prompt) == m.create(3, prompt) == 64

    def queried() -> tuple[int, int]:
        return m.stats().reuse_queried_tokens, m.stats().reuse_hit_tokens

    assert queried() == (70, 0) and m.requests.pending_lookups == 2
    assert not m.resize_many([2, 3], [64, 64 + 16 * 8], [64, 64])  # 8 more pages: 7 are free
    assert queried() == (70, 0) and m.requests.pending_lookups == 2
    assert m.resize_many([2, 3], [64, 65], [64, 64])  # request 2 keeps its shape, 3 takes a page
    assert queried() == (70 + 140, 128) and m.requests.pending_lookups == 0
    assert m.extend([2, 3], 1) and queried() == (210, 128)
    m.create(4, prompt)
    m.free(4)  # never moved: never counted
    assert queried() == (210, 128) and m.requests.pending_lookups == 0
    m.check_integrity()


def test_the_crossing_writes_through_tables_that_gained_rows_and_width() -> None:
    # the crossing writes single entries through per-row views of the tables (`PageTables.rows`):
    # more requests than the tables' first rows (`add_slots`) and a dummy past their first width
    # (`widen`, dummies have no capacity limit) must leave the same tables as the planner's
    spec = twin_spec(tpb=TPB, window=WINDOW)
    pages = {"full": 600, "sliding": 200}
    fast = manager(spec, pages, reuse=False, max_batch_size=1, max_seq_len=12)
    slow = planner_only(manager(spec, pages, reuse=False, max_batch_size=1, max_seq_len=12))
    rows, width = fast.tables.tables[0].shape
    rids = list(range(3 * rows))
    dummies = []
    for m in (fast, slow):
        for rid in rids:
            m.create(rid)
            assert m.resize(rid, 1 + rid % TPB, rid % TPB)
        dummies.append(m.add_dummy_requests(1, 2).ids[0])
    for _ in range(8):  # every request crosses a page boundary at least once, in batches of all of them
        assert fast.extend(rids, 1) and slow.extend(rids, 1)
    for _ in range(3 * width * TPB):  # the dummy, one decode step at a time, well past the first width
        assert fast.advance(dummies[0]) and slow.advance(dummies[1])
    assert fast.tables.tables[0].shape[0] > rows and fast.tables.tables[0].shape[1] > width
    assert observed(fast) == observed(slow)
    fast.check_integrity()


@pytest.mark.parametrize("events", [False, True])
def test_rows_that_cross_together_evict_the_pages_the_planner_evicts(events: bool) -> None:
    # two rows cross at once with the free stack empty: the crossing evicts a page for each, one eviction
    # per row where the evictions are seen (events), one for both rows where they are not
    def build(crossable: bool) -> KVCacheManager:
        m = manager(full_spec(tpb=TPB), {"full": 12}, events=events)  # three prompts of four pages
        m.tables.crossable = crossable
        prompt = list(range(4 * TPB))
        admit_ids(m, 0, prompt)
        assert m.commit(0, len(prompt), None) == len(prompt)
        m.free(0)  # its 4 pages wait in the LRU
        admit_ids(m, 1, [1_000 + i for i in prompt])
        admit_ids(m, 2, [2_000 + i for i in prompt])  # the free stack is empty now
        return m

    fast, slow = build(True), build(False)
    assert not fast.pools[0].free_stack and fast.pools[0].num_cached == 4
    assert fast.extend([1, 2], 1) and slow.extend([1, 2], 1)
    assert fast.pools[0].num_cached == 2
    assert fast.take_events() == slow.take_events()
    assert observed(fast) == observed(slow)
    fast.check_integrity()


def admit_ids(m: KVCacheManager, rid: int, prompt: list[int]) -> None:
    m.create(rid, prompt)
    assert m.resize(rid, len(prompt), len(prompt))
