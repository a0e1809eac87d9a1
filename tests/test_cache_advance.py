"""`advance(rid, token)`, the one-call decode step, is exactly `resize(rid,
capacity + 1, history + 1)` then `commit(rid, history + 1, (token,))`: the
same tables, pools, LRU order, events and stats on random runs (full,
sliding and state groups with state snapshots, reuse on and off, pools that
run short), and a refused or bad call changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, full_spec, hybrid_spec, manager, observed, snapshot, twin_spec
from kvpool.cache import CacheUsageError, KVCacheManager

TPB = 4


def two_calls(m: KVCacheManager, rid: int, token: int | None) -> bool:
    cap, hist = m.capacity(rid), m.history(rid)
    done = bool(m.resize(rid, cap + 1, hist + 1))
    if done and token is not None:
        m.commit(rid, hist + 1, (token,))
    return done


def admit(one: KVCacheManager, two: KVCacheManager, rid: int, prompt: list[int], ahead: int, commit: bool) -> bool:
    """Create `rid` in both managers, resize it to the prompt (plus `ahead`
    slots for drafts; both answer alike) and commit the prompt unless not
    `commit` (a lagging prompt: its pages commit at the first advance with an id)."""
    for m in (one, two):
        m.create(rid, prompt)
    ok = [bool(m.resize(rid, len(prompt) + ahead, len(prompt))) for m in (one, two)]
    assert ok[0] == ok[1]
    if ok[0] and commit:
        for m in (one, two):
            m.commit(rid, len(prompt))
    return ok[0]


def step_both(one: KVCacheManager, two: KVCacheManager, rid: int, token: int | None) -> bool:
    """`advance` on `one`, the two calls on `two`: same answer, events and state."""
    done = bool(one.advance(rid, token))
    assert done == two_calls(two, rid, token)
    assert one.take_events() == two.take_events()
    assert observed(one) == observed(two)
    return done


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["full", "sliding", "hybrid"]),
    reuse=st.booleans(),
    full_pages=st.integers(6, 30),
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=11), min_size=1, max_size=4),
    lagging=st.lists(st.booleans(), min_size=4, max_size=4),
    steps=st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 3))), max_size=60),
)
def test_advance_is_resize_then_commit(
    kind: str,
    reuse: bool,
    full_pages: int,
    prompts: list[list[int]],
    lagging: list[bool],
    steps: list[tuple[int, int | None]],
) -> None:
    # (the hybrid's state group snapshots its slot at commits: advance's early return must never skip one)
    spec = {"full": full_spec, "sliding": lambda tpb: twin_spec(tpb=tpb, window=6), "hybrid": hybrid_spec}[kind](TPB)
    pages = {"full": full_pages, "sliding": 10, "linear_state": 8}
    pages = {g.name: pages[g.name] for g in spec.groups}
    one, two = manager(spec, pages, reuse=reuse), manager(spec, pages, reuse=reuse)
    live = [rid for rid, prompt in enumerate(prompts) if admit(one, two, rid, prompt, 0, not lagging[rid])]
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
        if step_both(one, two, rid, token) and token is None:
            untokened.add(rid)
    assert one.stats() == two.stats()
    one.check_integrity()


@pytest.mark.parametrize("prompt_len", range(1, 2 * TPB + 1))
def test_a_bad_token_changes_nothing(prompt_len: int) -> None:
    """Wherever the step lands (inside a page, completing one, crossing into the next)."""
    m = manager(full_spec(tpb=TPB), {"full": 8})
    m.create(0, list(range(prompt_len)))
    assert m.resize(0, prompt_len, prompt_len)
    m.commit(0, prompt_len)
    before = snapshot(m)
    for bad in (-1, 1 << 63, 2.0, "7", True, False):
        with pytest.raises(CacheUsageError, match="advance's token"):
            m.advance(0, bad)  # type: ignore[arg-type]
        assert_unchanged(before, snapshot(m))
    assert m.advance(0, 4) and (m.capacity(0), m.history(0)) == (prompt_len + 1, prompt_len + 1)
    assert m.commit(0, prompt_len + 1) == (prompt_len + 1) // TPB * TPB  # the id reached its page


@pytest.mark.parametrize("steps", range(2 * TPB + 1))
def test_ids_short_of_history_raise_wherever_the_step_lands(steps: int) -> None:
    m = manager(full_spec(tpb=TPB), {"full": 8})
    m.create(0, [1, 2, 3])
    assert m.resize(0, 3, 3)
    for token in range(steps):
        assert m.advance(0, token)
    assert m.advance(0)  # no id: the known ids stop one short of history from here on
    before = snapshot(m)
    with pytest.raises(CacheUsageError, match="known"):
        m.advance(0, 7)
    assert_unchanged(before, snapshot(m))


@pytest.mark.parametrize("prompt_len", [8, 9, 10])
def test_an_advance_right_after_create_counts_the_prompt_lookup(prompt_len: int) -> None:
    """The prefix lookup counts at a request's first move, whichever call makes it."""
    prompt = list(range(prompt_len))
    one, two = (manager(full_spec(tpb=TPB), {"full": 8}) for _ in range(2))
    assert admit(one, two, 0, prompt, 0, True)
    for m in (one, two):
        assert m.create(1, prompt) > 0  # a hit: capacity and history at the reused length
    assert step_both(one, two, 1, None)
    assert one.stats() == two.stats() and one.stats().reuse_hit_tokens > 0


def test_a_short_pool_refuses_and_changes_nothing() -> None:
    m = manager(full_spec(tpb=TPB), {"full": 1})
    m.create(0, [1, 2, 3])
    assert m.resize(0, 4, 3)
    before = snapshot(m)
    assert not m.advance(0, 9)  # capacity 5 needs a second page
    assert_unchanged(before, snapshot(m))


@settings(max_examples=150, deadline=None)
@given(
    sliding=st.booleans(),
    full_pages=st.integers(4, 24),
    prompts=st.lists(
        st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=13), st.integers(0, 5), st.booleans()),
        min_size=1,
        max_size=3,
    ),
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=20, max_size=90),
)
def test_decode_runs_with_tokens_match_two_calls(
    sliding: bool, full_pages: int, prompts: list[tuple[list[int], int, bool]], steps: list[tuple[int, int]]
) -> None:
    """Reuse on and an id at every step, the decode loop's shape: runs long
    enough to cross pages, complete them and (sliding) drop them, with room
    for drafts (capacity ahead of history) and prompts left uncommitted."""
    spec = twin_spec(tpb=TPB, window=6) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": 8} if sliding else {"full": full_pages}
    one, two = manager(spec, pages), manager(spec, pages)
    live = [
        rid for rid, (prompt, ahead, lagging) in enumerate(prompts) if admit(one, two, rid, prompt, ahead, not lagging)
    ]
    for pick, token in steps:
        if not live:
            break
        step_both(one, two, live[pick % len(live)], token)
    assert one.stats() == two.stats()
    one.check_integrity()
