"""`advance(rid, token)`, the one-call decode step, is exactly `resize(rid,
capacity + 1, history + 1)` then `commit(rid, history + 1, (token,))`: the
same tables, pools, LRU order, events and stats on random runs (full and
sliding groups, reuse on and off, pools that run short), and a refused or
bad call changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, full_spec, manager, observed, snapshot, twin_spec
from kvpool.cache import CacheUsageError, KVCacheManager

TPB = 4


def two_calls(m: KVCacheManager, rid: int, token: int | None) -> bool:
    cap, hist = m.capacity(rid), m.history(rid)
    done = bool(m.resize(rid, cap + 1, hist + 1))
    if done and token is not None:
        m.commit(rid, hist + 1, (token,))
    return done


@settings(max_examples=150, deadline=None)
@given(
    sliding=st.booleans(),
    reuse=st.booleans(),
    full_pages=st.integers(6, 30),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=11), min_size=1, max_size=4),
    steps=st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 3))), max_size=60),
)
def test_advance_is_resize_then_commit(
    sliding: bool, reuse: bool, full_pages: int, prompts: list[list[int]], steps: list[tuple[int, int | None]]
) -> None:
    spec = twin_spec(tpb=TPB, window=6) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": 10} if sliding else {"full": full_pages}
    one, two = manager(spec, pages, reuse=reuse), manager(spec, pages, reuse=reuse)
    live: list[int] = []
    for rid, prompt in enumerate(prompts):
        for m in (one, two):
            m.create(rid, prompt)
        ok = [bool(m.resize(rid, len(prompt), len(prompt))) for m in (one, two)]
        assert ok[0] == ok[1]
        if ok[0]:
            for m in (one, two):
                m.commit(rid, len(prompt))
            live.append(rid)
    untokened: set[int] = set()  # requests advanced without an id: their known ids stop short of history
    for pick, token in steps:
        if not live:
            break
        rid = live[pick % len(live)]
        if token is not None and rid in untokened and reuse:
            before = snapshot(one)
            with pytest.raises(CacheUsageError, match="known"):
                one.advance(rid, token)
            assert_unchanged(before, snapshot(one))
            continue
        done = bool(one.advance(rid, token))
        assert done == two_calls(two, rid, token)
        if done and token is None:
            untokened.add(rid)
        assert one.take_events() == two.take_events()
        assert observed(one) == observed(two)
    assert one.stats() == two.stats()
    one.check_integrity()


def test_a_bad_token_changes_nothing() -> None:
    m = manager(full_spec(tpb=TPB), {"full": 8})
    m.create(0, [1, 2, 3])
    assert m.resize(0, 3, 3)
    before = snapshot(m)
    for bad in (-1, 1 << 63, 2.0, "7"):
        with pytest.raises(CacheUsageError, match="advance's token"):
            m.advance(0, bad)  # type: ignore[arg-type]
        assert_unchanged(before, snapshot(m))
    assert m.advance(0, 4) and (m.capacity(0), m.history(0)) == (4, 4)
    assert m.commit(0, 4) == 4  # the id reached the page: it completed and was stored


def test_a_short_pool_refuses_and_changes_nothing() -> None:
    m = manager(full_spec(tpb=TPB), {"full": 1})
    m.create(0, [1, 2, 3])
    assert m.resize(0, 4, 3)
    before = snapshot(m)
    assert not m.advance(0, 9)  # capacity 5 needs a second page
    assert_unchanged(before, snapshot(m))
