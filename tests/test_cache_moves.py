"""The one move (cache/tables.py, cache/manager.py): single calls and the batch
path move the same pages, store the same hashes and record the same events; a
batch is all or nothing, and its refusal names exactly the pages the page
arithmetic says are missing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, full_spec, manager, observed, snapshot, twin_spec
from kvpool.cache import KVCacheManager
from kvpool.spec.pages import pages_needed

TPB, WINDOW = 4, 10
BASE = list(range(500, 530))
PROMPTS = [BASE[:18], BASE[:18] + [7, 8, 9], BASE[:9], list(range(900, 913))]


class Driver:
    """One manager and the token ids it has been told, per request; `batched`
    sends every move and commit through the batch path (`resize_many`)."""

    def __init__(self, m: KVCacheManager, batched: bool) -> None:
        self.m, self.batched = m, batched
        self.known: dict[int, list[int]] = {}

    def create(self, rid: int, prompt: list[int]) -> int:
        self.known[rid] = list(prompt)
        return self.m.create(rid, prompt)

    def step(self, rid: int, cap: int, hist: int) -> Any:
        return self.m.resize_many([rid], [cap], [hist]) if self.batched else self.m.resize(rid, cap, hist)

    def commit(self, rid: int) -> int:
        hist, known = self.m.history(rid), self.known[rid]
        new = tuple(range(10_000 + len(known), 10_000 + hist)) if hist > len(known) else None
        known.extend(new or ())
        if self.batched and new:  # the general commit: a list of every new id at once
            return self.m.commit(rid, hist, list(new))
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
def test_single_and_batched_moves_and_commits_agree(
    ops: list[tuple[int, int, int, str]], reuse: bool, full_pages: int, sliding_pages: int, sliding: bool
) -> None:
    spec = twin_spec(tpb=TPB, window=WINDOW) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": sliding_pages} if sliding else {"full": full_pages}
    one, many = (Driver(manager(spec, pages, reuse=reuse), b) for b in (False, True))
    for d in (one, many):
        for rid, prompt in enumerate(PROMPTS):  # admitted and prefilled: decodes from here on
            hit = d.create(rid, prompt)
            d.step(rid, max(hit, len(prompt) - 3), max(hit, len(prompt) - 3))
    for rid, grow, done, op in ops:
        if op == "f":  # free and admit again: prefix hits on the pages committed so far
            one.m.free(rid)
            many.m.free(rid)
            assert one.create(rid, PROMPTS[rid]) == many.create(rid, PROMPTS[rid])
            continue
        cap = max(one.m.history(rid), one.m.capacity(rid) + grow)  # a shrink gives back drafted slots
        hist = min(cap, one.m.history(rid) + done)
        if cap > one.m.max_capacity:
            continue
        a, b = one.step(rid, cap, hist), many.step(rid, cap, hist)
        assert (bool(a), a.short) == (bool(b), b.short)
        if op == "c" and reuse:
            assert one.commit(rid) == many.commit(rid)
        assert one.m.take_events() == many.m.take_events()
        assert observed(one.m) == observed(many.m)
    assert one.m.stats() == many.m.stats()
    for d in (one, many):
        d.m.check_integrity()


# per request and step: (capacity change, how far history trails the new capacity)
batch_steps = st.lists(
    st.lists(st.tuples(st.integers(-2, TPB + 1), st.integers(0, 2 * TPB)), min_size=6, max_size=6),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(steps=batch_steps, full_pages=st.integers(10, 40))
def test_a_batch_fits_exactly_when_the_page_arithmetic_says_so(
    steps: list[list[tuple[int, int]]], full_pages: int
) -> None:
    # six requests decoding in one batch (reuse off, so no page is shared): the batch fits iff in
    # each group the pages it needs at the new shapes, less those it holds now, are free; a refusal
    # names that difference and changes nothing
    spec = twin_spec(tpb=TPB, window=WINDOW)
    m = manager(spec, {"full": full_pages, "sliding": 40}, reuse=False)
    rids = list(range(6))
    for rid in rids:
        m.create(rid)
    for step in steps:
        caps = [max(m.history(r), m.capacity(r) + g) for r, (g, _) in zip(rids, step, strict=True)]
        hists = [max(m.history(r), c - lag) for r, c, (_, lag) in zip(rids, caps, step, strict=True)]
        missing = {}
        for g in spec.groups:
            need = sum(pages_needed(g, c, h) for c, h in zip(caps, hists, strict=True))
            held = sum(m.live_pages(r, g.name) for r in rids)
            if need - held > m.free_pages(g.name):
                missing[g.name] = need - held - m.free_pages(g.name)
        before = snapshot(m)
        done = m.resize_many(rids, caps, hists)
        assert dict(done.short) == missing
        if not done:
            assert_unchanged(before, snapshot(m))
        else:
            assert [(m.capacity(r), m.history(r)) for r in rids] == list(zip(caps, hists, strict=True))
    m.check_integrity()


@pytest.mark.parametrize("sliding", [False, True])
def test_a_shrink_to_the_page_edge_after_a_crossing_gives_the_page_back(sliding: bool) -> None:
    # 16-token pages: capacity 16 -> 17 crosses into a second page, 17 -> 16 gives it back
    # (capacity 16 needs ceil(16 / 16) = 1 page), 16 -> 32 -> 33 crosses again
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
