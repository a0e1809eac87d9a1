"""`resize(rid, capacity, history, tokens)`: a decode step's one call. It moves
the same pages, stores the same hashes and records the same events as `resize`
followed by `commit(rid, min(history, known tokens), tokens)`; bad tokens
change nothing; the common step (one token, no page completing) stays on the
fast path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, full_spec, manager, snapshot, twin_spec
from kvpool.cache import CacheUsageError, KVCacheManager
from kvpool.cache.core import KVCacheCore

TPB = 4
PROMPTS = [list(range(500, 518)), list(range(500, 509)) + [1, 2, 3], list(range(900, 913))]


def observed(m: KVCacheManager) -> dict[str, Any]:
    """Shapes, tables and pools, read without writing the mirrors back."""
    out: dict[str, Any] = {}
    for rid, _ in m.iter_requests():
        out[f"r{rid}"] = (m.capacity(rid), m.history(rid), [m.block_table(rid, g.name).tolist() for g in m.groups])
    for p in m.pools:
        out[p.name] = (list(p.ref), list(p.page_hash), list(p.free_stack), p.lru_order())
    return out


# each step: (request, capacity growth, history growth, how many new token ids to pass: None = no tokens)
steps = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, TPB + 1), st.integers(0, TPB + 1), st.none() | st.integers(0, 3)),
    min_size=5,
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(ops=steps, sliding=st.booleans(), full_pages=st.integers(8, 20))
def test_one_call_equals_resize_then_commit(
    ops: list[tuple[int, int, int, int | None]], sliding: bool, full_pages: int
) -> None:
    spec = twin_spec(tpb=TPB, window=10) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": 12} if sliding else {"full": full_pages}
    one, two = (manager(spec, pages) for _ in range(2))
    known = {rid: len(p) for rid, p in enumerate(PROMPTS)}
    for m in (one, two):
        for rid, prompt in enumerate(PROMPTS):
            m.create(rid, prompt)
    for rid, grow, done, count in ops:
        cap = one.capacity(rid) + grow
        hist = min(cap, one.history(rid) + done)
        new = None if count is None else tuple(range(7000 + known[rid], 7000 + known[rid] + count))
        a = one.resize(rid, cap, hist, new)
        b = two.resize(rid, cap, hist)
        assert (bool(a), a.short) == (bool(b), b.short)
        if b and new is not None:
            two.commit(rid, min(hist, known[rid] + len(new)), new)
            known[rid] += len(new)
        assert observed(one) == observed(two)
        assert one.take_events() == two.take_events()
    assert one.stats() == two.stats()
    one.check_integrity()


@pytest.mark.parametrize("bad", [("7",), (1.5,), (-1,), (2**63,), (1, "x")])
def test_bad_tokens_change_nothing(bad: tuple[Any, ...]) -> None:
    m = manager(full_spec(tpb=TPB), {"full": 12})
    m.create(0, PROMPTS[0])
    assert m.resize(0, 18, 17)
    before = snapshot(m)
    with pytest.raises(CacheUsageError, match="resize's tokens"):
        m.resize(0, 19, 18, bad)
    assert_unchanged(before, snapshot(m))
    assert (m.capacity(0), m.history(0)) == (18, 17)


def test_reuse_off_checks_tokens_and_ignores_them() -> None:
    m = manager(full_spec(tpb=TPB), {"full": 12}, reuse=False)
    m.create(0)
    assert m.resize(0, 8, 7, (5,))
    assert m.stats().groups["full"].cached == 0
    with pytest.raises(CacheUsageError):
        m.resize(0, 9, 8, ("x",))  # type: ignore[arg-type]


def test_a_decode_takes_the_long_way_only_when_a_page_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 decode steps over 4-token pages: a page completes every 4th step, the others stay on the fast path
    m = manager(full_spec(tpb=TPB), {"full": 40})
    m.create(0, PROMPTS[0])
    assert m.resize(0, 18, 0) and m.resize(0, 19, 18)
    m.commit(0, 18)
    long_way: list[int] = []
    real = KVCacheCore._resize_and_commit

    def counted(self: KVCacheCore, *args: Any) -> Any:
        long_way.append(args[2])  # the history asked for
        return real(self, *args)

    monkeypatch.setattr(KVCacheCore, "_resize_and_commit", counted)
    for step in range(1, 65):
        assert m.resize(0, 19 + step, 18 + step, (3000 + step,))
    # a step with history h completes a page when h is a multiple of 4 (floor(h / 4) pages then)
    assert long_way == [h for h in range(19, 83) if h % TPB == 0]
    assert m.commit(0, 82) == 80  # every whole page below history 82 was offered already
    m.check_integrity()
