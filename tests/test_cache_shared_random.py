"""Random operations on a pool shared by two groups: it never hands out more
pages than it has, refusals change nothing, and the bookkeeping stays consistent.

Without reuse every page has one owner, so the pages in use are exactly the sum
over requests and groups of `pages_needed` at each request's shape, and a resize
succeeds exactly when that sum after it is at most the pool's pages.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, snapshot, twin_spec
from kvpool.cache import KVCacheManager
from kvpool.spec.pages import pages_needed
from shared_pool_helpers import shared_manager

PAGES = 24
OPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "grow", "extend", "free", "commit"]),
        st.integers(0, 5),  # request id
        st.integers(0, 160),  # capacity step
        st.integers(0, 70),  # history step
    ),
    min_size=10,
    max_size=40,
)


def in_use(m: KVCacheManager, shapes: dict[int, tuple[int, int]]) -> int:
    return sum(pages_needed(g, c, h) for c, h in shapes.values() for g in m.groups)


def distinct_owned(m: KVCacheManager) -> int:
    return sum(1 for r in m.pools[0].ref if r > 0)


def apply(m: KVCacheManager, op: tuple[str, int, int, int], shapes: dict[int, tuple[int, int]], exact: bool) -> None:
    kind, rid, dc, dh = op
    tokens = [rid % 2] * 200  # two prompts, so prefixes repeat
    if kind == "create":
        if rid not in shapes:
            hit = m.create(rid, tokens if m.enable_reuse else None)
            shapes[rid] = (hit, hit)
        return
    if rid not in shapes and kind != "extend":
        return
    if kind == "free":
        m.free(rid)
        del shapes[rid]
        return
    if kind == "commit":
        m.commit(rid, min(shapes[rid][1], len(tokens)))
        return
    rids = sorted(shapes) if kind == "extend" else [rid]
    new = {r: (shapes[r][0] + dc // 10 + 1, shapes[r][1] + dc // 10 + 1) for r in rids} if kind == "extend" else {}
    if kind == "grow":
        cap, hist = shapes[rid]
        hist = min(hist + dh, cap + dc)
        new = {rid: (cap + dc, hist)}
    if not rids:
        return
    before = snapshot(m)
    expected_used = in_use(m, {**shapes, **new})
    done = m.extend(rids, dc // 10 + 1) if kind == "extend" else m.resize(rid, *new[rid])
    if exact:
        assert bool(done) == (expected_used <= PAGES), (op, shapes, done.short)
    if done:
        shapes.update(new)
    else:
        assert_unchanged(before, snapshot(m))
        assert set(done.short) == {"shared"} and all(v > 0 for v in done.short.values())


def check(m: KVCacheManager, shapes: dict[int, tuple[int, int]], exact: bool) -> None:
    m.check_integrity()
    assert m.free_pages("full") == m.free_pages("sliding")
    assert distinct_owned(m) + m.free_pages("full") == PAGES  # owned + free (cached included) = all
    if exact:
        assert distinct_owned(m) == in_use(m, shapes) <= PAGES
        assert m.free_pages("full") == PAGES - in_use(m, shapes)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_shared_pool_without_reuse_is_exact(ops: list[Any]) -> None:
    m = shared_manager(twin_spec(tpb=16, window=40), PAGES, reuse=False, max_seq_len=1 << 14)
    shapes: dict[int, tuple[int, int]] = {}
    for op in ops:
        apply(m, op, shapes, exact=True)
        check(m, shapes, exact=True)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_shared_pool_with_reuse_stays_consistent(ops: list[Any]) -> None:
    m = shared_manager(twin_spec(tpb=16, window=40), PAGES, reuse=True, max_seq_len=1 << 14)
    shapes: dict[int, tuple[int, int]] = {}
    for op in ops:
        apply(m, op, shapes, exact=False)
        check(m, shapes, exact=False)
