"""Dummy requests (rule 2), the page-exact capacity query (rule 5) and the
CUDA-graph warmup dry run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, full_spec, hybrid_spec, manager, snapshot
from kvpool.cache import CacheUsageError, Dummies, KVCacheManager, SkippedShape
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import LayerGroup, ModelSpec


@pytest.mark.parametrize(("draft_len", "expected"), [(0, 128), (4, 124)])
def test_generation_dummy_at_a_page_boundary_fits(draft_len: int, expected: int) -> None:
    """The regression of the issue: 32-token pages, 6 free pages, batch of 3.
    Two minimal dummies (capacity 1 + d <= 32) take one page each, leaving 4
    pages = 128 positions for the longest row: token_num T with T + d = 128.
    Rule 2 gives that dummy capacity exactly 128 (history T - 1 plus the input
    token plus d drafts), so it fits; the old double count asked for 129."""
    m = manager(full_spec(tpb=32), {"full": 6})
    assert m.max_generation_length(3, draft_len) == expected
    assert m.add_dummy_requests(2, 1, draft_len)
    before = snapshot(m)
    refused = m.add_dummy_requests(1, expected + 1, draft_len)  # one token more: a 5th page
    assert not refused and refused.short == {"full": 1} and refused.ids == ()
    assert_unchanged(before, snapshot(m))
    long_row = m.add_dummy_requests(1, expected, draft_len)
    assert long_row
    (rid,) = long_row.ids
    assert (m.capacity(rid), m.history(rid)) == (128, expected - 1)
    assert m.live_pages(rid, "full") == 4 and m.free_pages("full") == 0
    m.check_integrity()


def test_dummies_hold_only_the_window_in_sliding_groups() -> None:
    m = manager(hybrid_spec(tpb=16, window=40), {"full": 100, "sliding": 10, "linear_state": 4})
    (rid,) = m.add_dummy_requests(1, 1000).ids
    # capacity 1000, history 999: full ceil(1000/16) = 63 pages; sliding
    # 63 - floor((999 + 1 - 40)/16) = 63 - 60 = 3; one state slot
    assert [m.live_pages(rid, g) for g in ("full", "sliding", "linear_state")] == [63, 3, 1]


def test_context_dummy_counts_extra_kv_tokens_once() -> None:
    m = manager(full_spec(tpb=16), {"full": 10}, num_extra_kv_tokens=2)
    (rid,) = m.add_dummy_requests(1, 30, draft_len=5, is_gen=False).ids
    # context: capacity 30 + E = 32 -> 2 pages, history 0 (drafts play no part)
    assert (m.capacity(rid), m.history(rid), m.live_pages(rid, "full")) == (32, 0, 2)
    (gen,) = m.add_dummy_requests(1, 30, draft_len=5).ids
    # generation: capacity 30 + 5 + 2 = 37 -> 3 pages, history 29
    assert (m.capacity(gen), m.history(gen), m.live_pages(gen, "full")) == (37, 29, 3)


def test_dummy_batches_are_all_or_nothing() -> None:
    m = manager(full_spec(tpb=16), {"full": 5})
    before = snapshot(m)
    assert not m.add_dummy_requests(3, 32)  # 3 x ceil(32/16) = 6 > 5 pages
    assert_unchanged(before, snapshot(m))
    assert m.num_requests == 0
    ids = m.add_dummy_requests(2, 32).ids
    assert len(ids) == 2 and all(r < 0 for r in ids)
    for rid in ids:
        m.free(rid)
    assert m.free_pages("full") == 5
    with pytest.raises(CacheUsageError):
        m.add_dummy_requests(1, 0)


def test_query_is_capped_at_max_seq_len_and_counts_pages_free_now() -> None:
    m = manager(full_spec(tpb=16), {"full": 100}, max_seq_len=300)
    assert m.max_generation_length(1) == 300  # 100 pages = 1600 positions, capped
    for rid, pages in enumerate([18] * 5 + [5]):  # 95 pages in requests no longer than max_seq_len
        m.create(rid)
        assert m.resize(rid, 16 * pages, 0)
    assert m.free_pages("full") == 5  # 80 positions
    assert m.max_generation_length(1) == 80
    assert m.max_generation_length(2, 3) == 64 - 3  # one page for the short row, 4 left
    assert m.max_generation_length(6) == 0  # 5 short rows eat every page


def test_warmup_reports_captured_and_skipped_shapes() -> None:
    m = manager(full_spec(tpb=16), {"full": 10})
    report = m.warmup([1, 2, 4, 8, 16], draft_lens=(0, 2))
    # b - 1 one-page minimal rows, the rest of 10 pages for the long one:
    # b=1: 10 pages = 160; b=2: 144; b=4: 112; b=8: 48; with d=2 two tokens less.
    # b=16 needs 16 one-page rows but there are 10 pages: 6 short.
    assert report.captured == [(1, 0), (2, 0), (4, 0), (8, 0), (1, 2), (2, 2), (4, 2), (8, 2)]
    assert [report.lengths[(b, 0)] for b in (1, 2, 4, 8)] == [160, 144, 112, 48]
    assert [report.lengths[(b, 2)] for b in (1, 2, 4, 8)] == [158, 142, 110, 46]
    assert report.skipped == [SkippedShape(16, 0, "full", 6), SkippedShape(16, 2, "full", 6)]
    # then one padding dummy per draft length: capacity 1 and 3, one page each
    assert report.reserved_pages == {"full": 2}
    assert set(report.padding) == {0, 2} and m.padding_dummy(2) == report.padding[2]
    s = m.stats().groups["full"]
    assert (s.free, s.reserved, s.dummy) == (8, 2, 0)
    assert report.to_json()["captured"][0] == [1, 0]
    m.check_integrity()
    assert m.warmup([1], (0, 2)).padding == report.padding  # idempotent reservation


def test_no_padding_dummy_when_every_batch_size_has_its_graph() -> None:
    # B = 2 and graphs for 1 and 2: no decode batch is ever padded, so a
    # reserved dummy would only take pages from real requests
    m = manager(full_spec(tpb=16), {"full": 4}, max_batch_size=2)
    report = m.warmup([1, 2], draft_lens=(0, 3))
    assert report.captured == [(1, 0), (2, 0), (1, 3), (2, 3)]
    assert report.padding == {0: None, 3: None} and report.padding_short == {}
    assert report.reserved_pages == {"full": 0} and m.free_pages("full") == 4
    assert m.warmup([1], draft_lens=(0,)).reserved_pages == {"full": 1}  # b = 2 not captured


def test_warmup_reports_a_padding_dummy_that_does_not_fit() -> None:
    m = manager(full_spec(tpb=16), {"full": 1})
    report = m.warmup([1], draft_lens=(0, 2))
    assert report.captured == [(1, 0), (1, 2)] and report.lengths == {(1, 0): 16, (1, 2): 14}
    assert report.padding == {0: m.padding_dummy(0), 2: None}
    assert report.padding_short == {2: {"full": 1}}


@settings(max_examples=100, deadline=None)
@given(
    tpb=st.sampled_from([1, 4, 16, 32]),
    draft=st.integers(0, 6),
    extra=st.integers(0, 2),
    window=st.integers(1, 90),
    batch=st.integers(1, 5),
    held=st.integers(0, 120),
    pages=st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 8)),
    max_seq_len=st.integers(1, 300),
)
def test_query_is_page_exact(
    tpb: int, draft: int, extra: int, window: int, batch: int, held: int, pages: tuple[int, int, int], max_seq_len: int
) -> None:
    """For any page size and draft length: the answer allocates, one page more
    does not, and no longer token_num up to the cap would (brute force)."""
    m = manager(
        hybrid_spec(tpb=tpb, window=window),
        {"full": pages[0], "sliding": pages[1], "linear_state": pages[2]},
        num_extra_kv_tokens=extra,
        max_seq_len=max_seq_len,
    )
    m.create(0)
    held = min(held, max_seq_len)  # a request is never longer than the plan's max_seq_len
    m.resize(0, held, held // 2)  # another request holds some pages (may be refused)
    answer = m.max_generation_length(batch, draft)

    def allocates(token_num: int) -> bool:
        before = m.stats()
        shorts = m.add_dummy_requests(batch - 1, 1, draft) if batch > 1 else Dummies()
        longest = m.add_dummy_requests(1, token_num, draft) if shorts else Dummies(short={"-": 1})
        for rid in shorts.ids + longest.ids:
            m.free(rid)
        m.take_events()
        assert m.stats() == before
        return bool(shorts and longest)

    assert 0 <= answer <= max_seq_len
    if answer:
        assert allocates(answer), f"answer {answer} does not allocate"
    if answer + tpb <= max_seq_len:
        assert not allocates(answer + tpb), f"answer {answer} + one page allocates"
    longer = [t for t in range(answer + 1, max_seq_len + 1) if allocates(t)]
    assert not longer, f"answer {answer} but {longer[:3]} allocate"


def bounded_spec(tpb: int, w1: int, w2: int, chunk: int) -> ModelSpec:
    """Only bounded groups: two sliding windows and a chunked group (the query
    then has no growing group to bisect and relies on its scan)."""
    groups = (
        LayerGroup("sliding_a", "sliding", (0,), tpb, row_bytes=8, window=w1),
        LayerGroup("sliding_b", "sliding", (1,), tpb, row_bytes=16, window=w2),
        LayerGroup("chunked", "chunked", (2,), tpb, row_bytes=8, window=chunk),
    )
    return ModelSpec("bounded", "test", groups, tpb, "bf16", 1, 3)


@settings(max_examples=60, deadline=None)
@given(
    tpb=st.sampled_from([1, 4, 8, 16]),
    draft=st.integers(0, 3),
    w1=st.integers(1, 60),
    w2=st.integers(1, 120),
    chunk=st.integers(1, 100),
    batch=st.integers(1, 3),
    pages=st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(1, 30)),
    max_seq_len=st.integers(1, 400),
)
def test_query_is_exact_with_only_bounded_groups(
    tpb: int, draft: int, w1: int, w2: int, chunk: int, batch: int, pages: tuple[int, int, int], max_seq_len: int
) -> None:
    plan = PoolPlan.from_pages(
        bounded_spec(tpb, w1, w2, chunk),
        dict(zip(("sliding_a", "sliding_b", "chunked"), pages, strict=True)),
        ServingLimits(max_batch_size=8, max_seq_len=max_seq_len),
    )
    m = KVCacheManager(plan)
    answer = m.max_generation_length(batch, draft)

    def allocates(token_num: int) -> bool:
        shorts = m.add_dummy_requests(batch - 1, 1, draft) if batch > 1 else Dummies()
        longest = m.add_dummy_requests(1, token_num, draft) if shorts else Dummies(short={"-": 1})
        for rid in shorts.ids + longest.ids:
            m.free(rid)
        return bool(shorts and longest)

    fitting = [t for t in range(1, max_seq_len + 1) if allocates(t)]
    assert answer == max(fitting, default=0), f"answer {answer}, brute force {fitting[-3:]}"


def test_query_is_fast_when_a_window_pool_is_tiny_at_a_million_tokens() -> None:
    # used to scan a million lengths one by one. One 128-token page of a 128-token
    # window holds a row whose token_num T is a multiple of 128: capacity T ends on
    # a page boundary and history T - 1 leaves every earlier page stale. 2**20 is
    # one, and the other groups hold it (sliding_b: 2 of 5 pages, chunked: 64 of 100).
    plan = PoolPlan.from_pages(
        bounded_spec(128, 128, 256, 8192),
        {"sliding_a": 1, "sliding_b": 5, "chunked": 100},
        ServingLimits(max_batch_size=8, max_seq_len=1 << 20),
    )
    assert KVCacheManager(plan).max_generation_length(1) == 1 << 20


def test_manager_signature_matches_the_issue() -> None:
    m = KVCacheManager(manager(full_spec(), {"full": 2}).plan, enable_reuse=False)
    assert not m.enable_reuse and m.free_pages("full") == 2 and m.total_pages("full") == 2
