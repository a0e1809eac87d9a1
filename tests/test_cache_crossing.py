"""The decode step's page crossings, per request (cache/crossing.py) and batched
(batch.cross_by_one), and the one-page commit (reuse.commit_next_page): a manager
that takes them moves the same pages, stores the same hashes and records the
same events as one driven through the planner (`SlotTables.apply`) and the
general commit, refusals and evictions included."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, manager, observed, twin_spec
from kvpool.cache import KVCacheManager
from kvpool.cache.slots import SlotTables

TPB, WINDOW = 4, 10
BASE = list(range(500, 530))
PROMPTS = [BASE[:18], BASE[:18] + [7, 8, 9], BASE[:9], list(range(900, 913))]


class Driver:
    """One manager and the token ids it has been told, per request."""

    def __init__(self, m: KVCacheManager, batched: bool) -> None:
        self.m, self.batched = m, batched
        self.known: dict[int, list[int]] = {}

    def create(self, rid: int, prompt: list[int]) -> int:
        self.known[rid] = list(prompt)
        return self.m.create(rid, prompt)

    def step(self, rid: int, cap: int, hist: int) -> Any:
        if self.batched:  # the array path (the request's mirror is written back first), planner only
            with mock.patch("kvpool.cache.batch.cross_by_one", return_value=False):
                return self.m.resize_many([rid], [cap], [hist])
        return self.m.resize(rid, cap, hist)

    def commit(self, rid: int) -> int:
        hist, known = self.m.history(rid), self.known[rid]
        new = tuple(range(10_000 + len(known), 10_000 + hist)) if hist > len(known) else None
        known.extend(new or ())
        if self.batched:
            self.m.tables.flush()  # the request is no longer mirrored: the general commit
        return self.m.commit(rid, hist, new)


ops = st.lists(
    st.tuples(st.integers(0, 3), st.integers(-2, TPB + 1), st.integers(0, TPB + 1), st.sampled_from("rcf")),
    min_size=10,
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(
    ops=ops,
    reuse=st.booleans(),
    full_pages=st.integers(8, 20),
    sliding_pages=st.integers(6, 14),
    sliding=st.booleans(),
)
def test_crossings_and_page_commits_match_the_general_path(
    ops: list[tuple[int, int, int, str]], reuse: bool, full_pages: int, sliding_pages: int, sliding: bool
) -> None:
    # full + sliding groups (`cross`), or one full group (its single-group grow)
    spec = twin_spec(tpb=TPB, window=WINDOW) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": sliding_pages} if sliding else {"full": full_pages}
    fast, slow = (Driver(manager(spec, pages, reuse=reuse), b) for b in (False, True))
    for d in (fast, slow):
        for rid, prompt in enumerate(PROMPTS):  # admitted and prefilled: decodes from here on
            hit = d.create(rid, prompt)
            d.step(rid, max(hit, len(prompt) - 3), max(hit, len(prompt) - 3))
    for rid, grow, done, op in ops:
        if op == "f":  # free and admit again: prefix hits on the pages committed so far
            fast.m.free(rid)
            slow.m.free(rid)
            assert fast.create(rid, PROMPTS[rid]) == slow.create(rid, PROMPTS[rid])
            continue
        cap = max(fast.m.history(rid), fast.m.capacity(rid) + grow)  # a shrink gives back drafted slots
        hist = min(cap, fast.m.history(rid) + done)
        if cap > fast.m.max_capacity:
            continue
        a, b = fast.step(rid, cap, hist), slow.step(rid, cap, hist)
        assert (bool(a), a.short) == (bool(b), b.short)
        if op == "c" and reuse:
            assert fast.commit(rid) == slow.commit(rid)
        assert fast.m.take_events() == slow.m.take_events()
        assert observed(fast.m) == observed(slow.m)
    assert fast.m.stats() == slow.m.stats()
    for d in (fast, slow):
        d.m.check_integrity()


def test_a_decode_takes_neither_the_planner_nor_the_general_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    # 200 decode steps of two requests over 16-token pages, a sliding window of 40 and reuse on:
    # every page crossing and every page that completes goes through the fast paths
    m = manager(twin_spec(tpb=16, window=40), {"full": 64, "sliding": 16})
    prompts = [list(range(100, 170)), list(range(300, 370))]
    for rid, prompt in enumerate(prompts):
        m.create(rid, prompt)
        assert m.resize(rid, 70, 0) and m.resize(rid, 71, 70)
        m.commit(rid, 70)
    planned: list[int] = []
    real_plan = SlotTables.plan_one

    def counted_plan(*args: Any) -> Any:
        planned.append(1)
        return real_plan(*args)

    monkeypatch.setattr(SlotTables, "plan_one", counted_plan)
    for step in range(1, 201):
        for rid in (0, 1):
            assert m.resize(rid, 71 + step, 70 + step)
            assert m.commit(rid, 70 + step, (1000 + step,)) == (70 + step) // 16 * 16
    assert planned == []
    # 271 positions: ceil(271 / 16) = 17 full pages; the window keeps pages from floor((270 + 1 - 40) / 16) = 14
    assert m.block_table(0, "full").tolist() == [p for p in m.block_table(0, "full").tolist() if p >= 0]
    assert len(m.block_table(0, "full")) == 17
    assert sum(p >= 0 for p in m.block_table(0, "sliding").tolist()) == 17 - 14
    assert m.stats().groups["full"].cached == 0  # nothing released yet; 2 x 16 committed pages stay owned
    m.check_integrity()


# per request and step: (capacity change, how far history trails the new capacity)
batch_steps = st.lists(
    st.lists(st.tuples(st.integers(-2, TPB + 1), st.integers(0, 2 * TPB)), min_size=6, max_size=6),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(steps=batch_steps, full_pages=st.integers(10, 40), reuse=st.booleans())
def test_batched_crossings_match_the_planner(steps: list[list[tuple[int, int]]], full_pages: int, reuse: bool) -> None:
    # six requests decoding in one batch: capacity moves by -2..TPB+1 a step (a shrink gives back
    # drafted slots, never computed ones) with history trailing it; the batch path's one-page
    # crossings (or their refusal, naming the pages short) and the thresholds they leave equal
    # the planner's
    pages = {"full": full_pages, "sliding": 40}
    fast, slow = (manager(twin_spec(tpb=TPB, window=WINDOW), pages, reuse=reuse) for _ in range(2))
    rids = list(range(6))
    for m in (fast, slow):
        for rid in rids:
            m.create(rid, list(range(100 * rid, 100 * rid + 60)))
    for step in steps:
        caps = [max(fast.history(r), fast.capacity(r) + g) for r, (g, _) in zip(rids, step, strict=True)]
        hists = [max(fast.history(r), c - lag) for r, c, (_, lag) in zip(rids, caps, step, strict=True)]
        a = fast.resize_many(rids, caps, hists)
        with mock.patch("kvpool.cache.batch.cross_by_one", return_value=False):
            b = slow.resize_many(rids, caps, hists)
        assert (bool(a), a.short) == (bool(b), b.short)
        assert observed(fast) == observed(slow)
        assert fast.take_events() == slow.take_events()
    fast.check_integrity()


@pytest.mark.parametrize("sliding", [False, True])
def test_a_shrink_to_the_page_edge_after_a_crossing_gives_the_page_back(sliding: bool) -> None:
    # 16-token pages: capacity 16 -> 17 crosses into a second page (the one-page crossing), 17 -> 16
    # gives it back (capacity 16 needs ceil(16 / 16) = 1 page), 16 -> 32 -> 33 crosses again
    spec = twin_spec(tpb=16, window=40) if sliding else full_spec(tpb=16)
    m = manager(spec, {g.name: 8 for g in spec.groups}, reuse=False)
    m.create(1)
    assert m.resize(1, 16, 0)
    for cap, pages in ((17, 2), (16, 1), (32, 2), (33, 3), (32, 2)):
        assert m.resize(1, cap, 0)
        for g in spec.groups:
            assert len(m.block_table(1, g.name)) == pages
            assert m.free_pages(g.name) == 8 - pages
    m.check_integrity()
