"""A pool shared by two groups (vLLM v1's shared block pool), by hand.

`twin_spec()`: groups `full` and `sliding` (W = 40), 16 positions per page, both
pages 4,096 bytes. A request of capacity c and history h holds ceil(c / 16)
full pages and ceil(c / 16) - floor((h + 1 - 40) / 16) sliding pages (stale
pages clamped at 0). Pages are handed out lowest id first, groups in spec order
(full, then sliding), releases before allocations.
"""

from __future__ import annotations

import pytest

from cache_helpers import assert_table, assert_unchanged, snapshot, twin_spec
from kvpool.cache import CacheIntegrityError, KVCacheManager
from kvpool.errors import SpecError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import Shape, load_model_spec
from shared_pool_helpers import POOL, shared_manager

TOKENS = list(range(1000, 1065))  # 65 prompt tokens: 4 whole pages, the last token never reused


def test_plan_counts_the_shared_pool_once() -> None:
    plan = PoolPlan.from_shared_pool(twin_spec(), 12, ServingLimits(max_seq_len=4096), name=POOL)
    assert plan.pool_of("full") == plan.pool_of("sliding") == POOL
    assert plan.total_bytes == plan.budget_bytes == 12 * 16 * 256  # 12 pages of 16 x 256 bytes, once
    assert plan.pool_pages() == {POOL: 12}
    # a request at (64, 0) needs 4 + 4 pages of the one pool: 12 // 8 = 1 fits
    assert plan.max_requests((64, 0)) == 1
    assert plan.check("fits", (Shape(48, 0), Shape(16, 0))).satisfied  # full 3 + 1, sliding 3 + 1: 8 <= 12
    assert plan.check("short", (Shape(64, 0), Shape(48, 0))).short == {POOL: 2}  # full 4 + 3, sliding 4 + 3: 14 - 12
    assert plan.to_json()["shared_pools"] == [
        {"name": POOL, "page_bytes": 4096, "pages": 12, "groups": ["full", "sliding"]}
    ]


def test_unequal_pages_cannot_share() -> None:
    spec = load_model_spec(
        {
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_size": 128,
            "torch_dtype": "bfloat16",
            "layer_types": ["full_attention", "full_attention", "sliding_attention"],
            "sliding_window": 40,
        },
        tokens_per_block=16,
    )  # full: 2 layers (8,192 B pages), sliding: 1 layer (4,096 B)
    with pytest.raises(SpecError, match="equal page bytes"):
        PoolPlan.from_shared_pool(spec, 12)


def test_allocation_in_one_group_reduces_the_others_free_pages() -> None:
    m = shared_manager(twin_spec(), 12)
    m.create(1)
    assert m.resize(1, 32)  # 2 full + 2 sliding pages
    assert m.free_pages("full") == m.free_pages("sliding") == 12 - 4
    assert m.total_pages("full") == m.total_pages("sliding") == 12
    assert m.pool_of("full") == POOL
    assert_table(m, 1, "full", [0, 1])
    assert_table(m, 1, "sliding", [2, 3])
    m.check_integrity()


def test_refused_resize_changes_nothing_and_names_the_shared_pool() -> None:
    m = shared_manager(twin_spec(), 12)
    m.create(1)
    assert m.resize(1, 32)  # 4 pages used, 8 free
    m.create(2)
    before = snapshot(m)
    # capacity 80: 5 full + 5 sliding = 10 > 8 free, although each group alone (5) would fit
    done = m.resize(2, 80)
    assert not done and done.short == {POOL: 2}
    assert not m.can_resize(2, 80)
    assert_unchanged(before, snapshot(m))
    assert m.resize(2, 64)  # 4 + 4 = 8 pages: exactly the free ones
    assert m.free_pages("full") == 0
    m.check_integrity()


def test_freeing_returns_pages_to_the_shared_list() -> None:
    m = shared_manager(twin_spec(), 12, reuse=False)
    for rid in (1, 2):
        m.create(rid)
        assert m.resize(rid, 48)  # 3 + 3 pages each
    assert m.free_pages("sliding") == 0
    # rid 1: full [0, 1, 2], sliding [3, 4, 5]; rid 2: full [6, 7, 8], sliding [9, 10, 11]
    assert_table(m, 1, "sliding", [3, 4, 5])
    m.free(1)  # tables walked backwards, full first: the free stack ends 2, 1, 0, 5, 4, 3
    assert m.free_pages("full") == m.free_pages("sliding") == 6
    m.create(3)
    assert m.resize(3, 48)
    assert_table(m, 3, "full", [3, 4, 5])  # the sliding group's pages now hold full-attention KV
    assert_table(m, 3, "sliding", [0, 1, 2])
    assert m.free_pages("full") == 0
    m.check_integrity()


def test_sliding_pages_that_leave_the_window_serve_the_full_group() -> None:
    m = shared_manager(twin_spec(), 12, reuse=False)
    m.create(1)
    assert m.resize(1, 64)  # full [0..3], sliding [4..7]: 8 used, free stack 8..11
    assert_table(m, 1, "full", [0, 1, 2, 3])
    assert_table(m, 1, "sliding", [4, 5, 6, 7])
    # history 64: floor((64 + 1 - 40) / 16) = 1 sliding page stale; capacity 65 needs a 5th block in both
    assert m.resize(1, 65, 64)
    # page 4 went back to the shared free list first and the full group took it
    assert_table(m, 1, "full", [0, 1, 2, 3, 4])
    assert_table(m, 1, "sliding", [-1, 5, 6, 7, 8])
    assert m.free_pages("full") == 12 - 9
    m.check_integrity()


def committed_and_freed(pages: int = 12) -> tuple[KVCacheManager, dict[str, list[int]]]:
    """A reuse-on manager after request 1 (65 prompt tokens, history 64)
    committed its 4 whole pages in both groups and was freed."""
    m = shared_manager(twin_spec(), pages)
    m.create(1, TOKENS)
    assert m.resize(1, 65, 0)
    assert m.resize(1, 65, 39)  # no sliding page is stale yet: floor((39 + 1 - 40) / 16) = 0
    assert m.commit(1, 39) == 32
    tables = {g: m.block_table(1, g).tolist() for g in ("full", "sliding")}
    m.free(1)
    return m, tables


def test_reuse_hits_stay_in_their_group() -> None:
    m, first = committed_and_freed()
    assert first == {"full": [0, 1, 2, 3, 4], "sliding": [5, 6, 7, 8, 9]}
    full, sliding = m.pools
    # both groups hashed the same two token pages (equal chains), each in its own map
    assert set(full.cached) == set(sliding.cached) and len(full.cached) == 2
    assert sorted(full.cached.values()) == [0, 1] and sorted(sliding.cached.values()) == [5, 6]
    m.check_integrity()
    assert m.create(2, TOKENS) == 32  # 2 whole pages hit
    assert_table(m, 2, "full", [0, 1])
    assert_table(m, 2, "sliding", [5, 6])
    m.check_integrity()


def test_eviction_by_one_group_drops_the_other_groups_hash() -> None:
    m, first = committed_and_freed(pages=10)
    m.take_events()
    m.create(3)
    # capacity 80: 5 + 5 pages = all 10, so the 4 cached pages of both groups are evicted
    assert m.resize(3, 80)
    full, sliding = m.pools
    assert full.cached == {} and sliding.cached == {}
    removed = [e for e in m.take_events() if e.kind == "removed"]
    assert sorted((e.group, e.page) for e in removed) == [("full", 0), ("full", 1), ("sliding", 5), ("sliding", 6)]
    m.check_integrity()
    m.free(3)
    assert m.create(4, TOKENS) == 0  # nothing left to hit, in either group
    m.check_integrity()


def test_integrity_catches_an_owned_page_on_the_shared_free_list() -> None:
    m = shared_manager(twin_spec(), 12)
    m.create(1)
    assert m.resize(1, 32)
    m.check_integrity()
    m.pools[1].free_stack.append(2)  # sliding's page 2 is owned: the shared list now hands it out
    with pytest.raises(CacheIntegrityError, match="shared: pages") as err:
        m.check_integrity()
    assert 2 in err.value.pages[POOL]


def test_integrity_catches_a_page_named_by_two_groups() -> None:
    m = shared_manager(twin_spec(), 12, reuse=False)
    m.create(1)
    assert m.resize(1, 32)  # full [0, 1], sliding [2, 3]
    # point full's second block at sliding's page 2, keeping every ref count consistent
    m.tables.tables[0][m.requests.get(1).slot, 1] = 2
    m.pools[0].ref[2] += 1
    m.pools[0].ref[1] -= 1
    m.pools[0].free_stack.append(1)
    with pytest.raises(CacheIntegrityError, match="named by group sliding") as err:
        m.check_integrity()
    assert err.value.pages == {POOL: [2]}


def test_longest_generation_is_page_exact_in_a_shared_pool() -> None:
    # a decode dummy of t tokens: capacity t, history t - 1, so ceil(t / 16) full pages and
    # ceil(t / 16) - floor((t - 40) / 16) sliding ones. t = 144: 9 + (9 - 6) = 12 pages, all;
    # t = 145: 10 + (10 - 6) = 14, and every t up to 160 keeps 10 full pages plus at least 4.
    m = shared_manager(twin_spec(), 12)
    assert m.max_generation_length(1) == 144
    # with a second, minimal row (t = 1: 1 + 1 pages) 10 are left: t = 112 takes 7 + 3; t = 113
    # to 127 take 8 full pages + 8 - floor((t - 40) / 16) >= 3 sliding ones, so 11 or more
    assert m.max_generation_length(2) == 112
    long = m.add_dummy_requests(1, 144)
    assert long and m.free_pages("full") == 0
    m.free(long.ids[0])
    assert not m.add_dummy_requests(1, 145)


def test_warmup_on_a_shared_pool_matches_the_plans_dry_run() -> None:
    from kvpool.plan.plan_pages import plan_warmup

    limits = ServingLimits(max_seq_len=4096, max_batch_size=8, cuda_graph_batch_sizes=(1, 2, 4, 8))
    plan = PoolPlan.from_shared_pool(twin_spec(), 40, limits, name=POOL)
    report = KVCacheManager(plan, enable_reuse=False).warmup()
    dry = plan_warmup(plan, (0,))
    assert report.captured == dry.captured and report.lengths == dry.lengths
    # batch 8: 7 minimal rows take 2 pages each, 26 of 40 are left for the longest. For
    # t = 16k + r (1 <= r <= 16, t >= 48) the rule above gives 2(k + 1) - (k - 3) = k + 5 pages
    # when r <= 7 and k + 4 when r >= 8: t = 368 (k = 22, r = 16) takes 26, t = 369 takes 28
    assert report.lengths[(8, 0)] == 368
