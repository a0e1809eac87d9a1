"""KVCacheManager core: resizes, stale pages, atomicity, batch path, errors.
Every expected number is worked out by hand in the test."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import (
    assert_table,
    assert_unchanged,
    full_spec,
    hybrid_spec,
    manager,
    snapshot,
)
from kvpool.cache import STALE, CacheUsageError, GroupStats, KVCacheManager
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.spec import LayerGroup, ModelSpec, stale_pages


def test_resize_grows_and_shrinks_by_whole_pages() -> None:
    m = manager(full_spec(tpb=16), {"full": 10})
    m.create(1)
    assert m.block_table(1, "full").size == 0 and m.free_pages("full") == 10
    # capacity 33 -> ceil(33/16) = 3 pages; the pool hands out 0, 1, 2
    assert m.resize(1, 33, 0)
    assert_table(m, 1, "full", [0, 1, 2])
    assert m.free_pages("full") == 10 - 3
    # capacity 32 -> 2 pages: the tail page 2 goes back
    assert m.resize(1, 32, 16)
    assert_table(m, 1, "full", [0, 1])
    assert (m.capacity(1), m.history(1)) == (32, 16) and m.free_pages("full") == 8
    m.free(1)
    assert m.free_pages("full") == 10 and 1 not in m
    m.check_integrity()


def test_sliding_pages_go_stale_when_history_rises() -> None:
    m = manager(hybrid_spec(tpb=16, window=40), {"full": 20, "sliding": 20, "linear_state": 4})
    m.create(7)
    assert m.resize(7, 100, 0)
    # nothing computed: ceil(100/16) = 7 pages in both attention groups, one state slot
    assert [m.live_pages(7, g) for g in ("full", "sliding", "linear_state")] == [7, 7, 1]
    assert m.resize(7, 101, 100)
    # stale = floor((100 + 1 - 40)/16) = floor(61/16) = 3 -> blocks 0..2 released, 7 - 3 = 4 live
    assert_table(m, 7, "sliding", [STALE, STALE, STALE, 3, 4, 5, 6])
    assert_table(m, 7, "full", [0, 1, 2, 3, 4, 5, 6])
    assert m.free_pages("sliding") == 20 - 4 and m.free_pages("full") == 20 - 7
    assert_table(m, 7, "linear_state", [0])
    m.check_integrity()


def test_released_stale_pages_pay_for_new_ones_in_the_same_resize() -> None:
    # sliding pool of exactly 4 pages: (capacity 64, history 63) holds
    # ceil(64/16) - floor((63+1-40)/16) = 4 - 1 = 3 pages; moving to (80, 79) needs
    # ceil(80/16) - floor((79+1-40)/16) = 5 - 2 = 3: one released, one new, never 5 at once
    m = manager(hybrid_spec(tpb=16, window=40), {"full": 5, "sliding": 3, "linear_state": 1})
    m.create(1)
    assert m.resize(1, 64, 63) and m.free_pages("sliding") == 0
    assert m.resize(1, 80, 79)
    assert m.live_pages(1, "sliding") == 3 and m.free_pages("sliding") == 0
    m.check_integrity()


def test_failed_resize_changes_nothing_in_any_group() -> None:
    # full has room (20 pages), sliding only 2: a resize to 48 needs 3 sliding pages
    m = manager(hybrid_spec(tpb=16, window=40), {"full": 20, "sliding": 2, "linear_state": 2})
    m.create(1)
    m.create(2)
    assert m.resize(1, 16, 0)  # 1 page per attention group
    before = snapshot(m)
    refused = m.resize(2, 48, 0)
    assert not refused
    assert_unchanged(before, snapshot(m))
    # free sliding pages: 2 - 1 = 1, needed 3 -> short by 2
    assert refused.short == {"sliding": 2}


def test_resize_many_is_atomic_over_the_batch() -> None:
    m = manager(full_spec(tpb=16), {"full": 5})
    for rid in (1, 2, 3):
        m.create(rid)
        assert m.resize(rid, 16, 15)
    # all three cross into a second page: 3 more pages, only 5 - 3 = 2 free
    before = snapshot(m)
    refused = m.extend([1, 2, 3])
    assert not refused
    assert_unchanged(before, snapshot(m))
    assert refused.short == {"full": 1}
    assert m.extend([1, 2])
    assert [m.live_pages(r, "full") for r in (1, 2, 3)] == [2, 2, 1]
    m.check_integrity()


def test_batch_path_matches_single_resizes() -> None:
    """200 decode steps through `extend` give the same tables (up to which page
    ids were handed out: the batch releases all stale pages before allocating)
    as per-request `resize`."""
    spec = hybrid_spec(tpb=16, window=40)
    pages = {"full": 400, "sliding": 80, "linear_state": 8}
    batch, single = manager(spec, pages), manager(spec, pages)
    prompts = [5, 16, 17, 39, 40, 64, 100]
    for rid, n in enumerate(prompts):
        for m in (batch, single):
            m.create(rid)
            assert m.resize(rid, n + 1, n)
    rids = list(range(len(prompts)))
    for _ in range(200):
        assert batch.extend(rids)
        for rid in rids:
            assert single.resize(rid, single.capacity(rid) + 1, single.history(rid) + 1)
    for rid in rids:
        for g in ("full", "sliding", "linear_state"):
            a, b = batch.block_table(rid, g), single.block_table(rid, g)
            assert (a >= 0).tolist() == (b >= 0).tolist(), (rid, g, a, b)
    batch.check_integrity()
    single.check_integrity()
    # request 0: history 5 + 200 = 205, capacity 206: full ceil(206/16) = 13 pages,
    # sliding 13 - floor((205 + 1 - 40)/16) = 13 - 10 = 3
    assert (batch.live_pages(0, "full"), batch.live_pages(0, "sliding")) == (13, 3)


def test_resize_many_takes_explicit_shapes() -> None:
    m = manager(full_spec(tpb=16), {"full": 10})
    m.create(1)
    m.create(2)
    assert m.resize_many([1, 2], np.array([17, 33]), np.array([0, 0]))
    assert [m.live_pages(r, "full") for r in (1, 2)] == [2, 3]
    tables = m.block_tables([1, 2], "full")
    assert tables.tolist() == [[0, 1, STALE], [2, 3, 4]]


@pytest.mark.parametrize(("capacity", "history"), [(10, 11), (5, 3)])
def test_bad_shapes_raise_typed_errors(capacity: int, history: int) -> None:
    m = manager(full_spec(), {"full": 4})
    m.create(1)
    assert m.resize(1, 8, 4)
    with pytest.raises(CacheUsageError):  # capacity < history, or history going back
        m.resize(1, capacity, history)
    with pytest.raises(CacheUsageError):
        m.resize_many([1], [capacity], [history])


def test_unknown_and_duplicate_ids_raise() -> None:
    m = manager(full_spec(), {"full": 4})
    m.create(1)
    with pytest.raises(CacheUsageError, match="already exists"):
        m.create(1)
    for call in (
        lambda: m.resize(9, 1),
        lambda: m.free(9),
        lambda: m.block_table(9, "full"),
        lambda: m.extend([1, 9]),
        lambda: m.commit(9, 0),
    ):
        with pytest.raises(KvpoolError, match="unknown request id 9"):
            call()
    with pytest.raises(CacheUsageError, match="same request twice"):
        m.extend([1, 1])
    with pytest.raises(CacheUsageError, match="no group"):
        m.free_pages("sliding")


def test_more_requests_than_slots_but_never_longer_than_max_seq_len() -> None:
    # slot arrays start at max_batch_size + 8 = 9 rows: they grow. Capacity stops at
    # max_seq_len + headroom (64 + 1), the length the pools were sized for.
    from kvpool.cache import CacheUsageError

    m = manager(full_spec(tpb=16), {"full": 200}, max_batch_size=1, max_seq_len=64)
    for rid in range(20):
        m.create(rid)
        assert m.resize(rid, 16, 0)
    assert m.resize(0, 65, 0)  # 5 pages: max_seq_len plus one decode token
    with pytest.raises(CacheUsageError, match="max_seq_len"):
        m.resize(0, 66, 0)
    with pytest.raises(CacheUsageError, match="max_seq_len"):
        m.extend([0, 1], 1)  # request 0 would reach 66
    assert m.capacity(0) == 65 and m.capacity(1) == 16
    assert m.live_pages(0, "full") == 5 and m.free_pages("full") == 200 - 5 - 19
    m.check_integrity()


def test_check_integrity_names_the_offending_pages() -> None:
    from kvpool.cache import CacheIntegrityError

    m = manager(full_spec(tpb=16), {"full": 6})
    m.create(1)
    assert m.resize(1, 32, 0)  # pages 0 and 1
    m.pools[0].ref[1] = 2  # a lost owner
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert err.value.pages == {"full": [1]} and "[1]" in str(err.value)
    m.pools[0].ref[1] = 1
    m.pools[0].free_stack.append(0)  # owned and free at once
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert err.value.pages == {"full": [0]}
    m.pools[0].free_stack.remove(0)
    m.pools[0].free_stack.remove(5)  # leaked: neither owned nor allocatable
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert err.value.pages == {"full": [5]}


def test_check_integrity_names_lists_and_hash_maps_that_disagree() -> None:
    from kvpool.cache import CacheIntegrityError

    m = manager(full_spec(tpb=16), {"full": 8})
    m.create(1, list(range(40)))
    assert m.resize(1, 33, 32)
    m.commit(1, 32)  # pages 0 and 1 carry hashes
    pool = m.pools[0]
    first = pool.page_hash[0]
    assert first is not None and pool.cached[first] == 0
    pool.cached[first] = 1  # the map names page 1 under page 0's hash
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert err.value.pages == {"full": [0, 1]} and "hash map and page hashes disagree" in str(err.value)
    pool.cached[first] = 0
    top = pool.free_stack[-1]
    pool.free_stack.append(top)  # one page twice on the free stack
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert err.value.pages == {"full": [top]} and "listed twice" in str(err.value)
    pool.free_stack.pop()
    m.check_integrity()


def test_check_integrity_reports_foreign_and_aliased_pages() -> None:
    from kvpool.cache import CacheIntegrityError

    m = manager(full_spec(tpb=16), {"full": 8})
    m.create(1)
    assert m.resize(1, 32, 0)
    m.tables.tables[0][m.requests.get(1).slot, 1] = 99  # a page id the pool does not have
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert 99 in err.value.pages["full"] and "outside the pool" in str(err.value)

    m = manager(full_spec(tpb=16), {"full": 8})
    for rid in (1, 2):
        m.create(rid)
        assert m.resize(rid, 32, 0)
    t, pool = m.tables, m.pools[0]
    mine, theirs = int(t.tables[0][m.requests.get(2).slot, 0]), int(t.tables[0][m.requests.get(1).slot, 0])
    t.tables[0][m.requests.get(2).slot, 0] = theirs  # request 2 now writes request 1's page
    pool.ref[theirs], pool.ref[mine] = 2, 0
    pool.free_stack.append(mine)
    with pytest.raises(CacheIntegrityError) as err:
        m.check_integrity()
    assert theirs in err.value.pages["full"] and "without a prefix hash" in str(err.value)


def test_stats_count_dummies_and_events_are_taken_once() -> None:
    m = manager(full_spec(tpb=16), {"full": 10})
    m.create(1, list(range(40)))
    assert m.resize(1, 33, 32)
    m.commit(1, 32)
    assert m.add_dummy_requests(2, 20)  # capacity 20, history 19: 2 pages each
    s = m.stats()
    assert (s.num_requests, s.num_dummies) == (1, 2)
    # request 1: 3 pages, dummies 2 x 2; 10 - 7 = 3 free
    assert s.groups["full"] == GroupStats(total=10, free=3, used=7, cached=0, dummy=4, reserved=0)
    assert len(m.take_events()) == 2 and m.take_events() == []
    m.free(1)
    assert m.stats().groups["full"].cached == 2  # its two committed pages


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["sliding", "chunked"]),
    tpb=st.integers(1, 64),
    window=st.integers(1, 300),
    hist=st.integers(0, 2000),
)
def test_next_stale_history_is_never_late(kind: str, tpb: int, window: int, hist: int) -> None:
    """The batch path skips a request until its history reaches `stale_next`:
    that must be the first history at which `stale_pages` grows (brute force)."""
    group = LayerGroup(
        name="g",
        kind=kind,
        layers=(0,),
        tokens_per_block=tpb,  # type: ignore[arg-type]
        row_bytes=8,
        window=window,
    )
    spec = ModelSpec("m", "test", (group,), tpb, "bf16", 1, 1)
    m = KVCacheManager(PoolPlan.from_pages(spec, {"g": 1}))
    now = stale_pages(group, hist)
    first = next(h for h in range(hist + 1, hist + 2 * (window + tpb) + 2) if stale_pages(group, h) > now)
    assert m.tables.next_stale(0, hist) == first


def test_extend_rejects_negative_steps() -> None:
    m = manager(full_spec(), {"full": 4})
    m.create(1)
    with pytest.raises(CacheUsageError):
        m.extend([1], -1)
    assert m.extend([], 1) and m.resize_many([], [])


def test_chunked_group_drops_whole_chunks() -> None:
    group = LayerGroup(name="chunked", kind="chunked", layers=(0,), tokens_per_block=16, row_bytes=8, window=32)
    m = KVCacheManager(PoolPlan.from_pages(ModelSpec("m", "test", (group,), 16, "bf16", 1, 1), {"chunked": 8}))
    m.create(1)
    assert m.resize(1, 41, 31)
    assert_table(m, 1, "chunked", [0, 1, 2])  # history 31 is still in chunk 0: nothing stale
    # history 40: the in-flight token's chunk starts at 32 = page 2, so pages 0 and 1
    # go; capacity 41 needs ceil(41/16) = 3 blocks -> one live page
    assert m.resize(1, 41, 40)
    assert_table(m, 1, "chunked", [STALE, STALE, 2])
    assert m.free_pages("chunked") == 8 - 1


def test_resize_many_keeps_history_when_not_given() -> None:
    m = manager(full_spec(tpb=16), {"full": 10})
    m.create(1)
    assert m.resize(1, 20, 10)
    assert m.resize_many([1], [40])
    assert (m.capacity(1), m.history(1), m.live_pages(1, "full")) == (40, 10, 3)


def test_freeing_a_padding_dummy_drops_the_reservation() -> None:
    m = manager(full_spec(tpb=16), {"full": 3})
    rid = m.reserve_padding_dummy(2)
    assert rid is not None and m.padding_dummy(2) == rid and m.reserve_padding_dummy(2) == rid
    assert m.stats().groups["full"].reserved == 1
    m.free(rid)
    assert m.padding_dummy(2) is None and m.free_pages("full") == 3


def test_can_resize_answers_without_changing_anything() -> None:
    m = manager(full_spec(tpb=16), {"full": 3})
    m.create(1)
    before = snapshot(m)
    assert m.can_resize(1, 48, 0)  # 3 pages fit, 4 do not
    refused = m.can_resize(1, 49, 0)
    assert not refused and refused.short == {"full": 1}
    assert_unchanged(before, snapshot(m))
    with pytest.raises(CacheUsageError):
        m.can_resize(1, 5, 6)
