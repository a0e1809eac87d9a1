"""Cold tiers below the GPU pools (cache/tiers.py): evicted pages move down
instead of being dropped, hits on colder tiers are copied back, suspended
requests park their pages there; pages are never lost or duplicated, quotas
hold, refusals change nothing, and reuse equals an unbounded GPU pool's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import assert_unchanged, full_spec, hybrid_spec, snapshot, twin_spec
from kvpool.cache import CacheUsageError, KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import LayerGroup, ModelSpec
from tier_helpers import TPB, Labels, tiered


def serve(m: KVCacheManager, rid: int, prompt: list[int]) -> int:
    """Admit, prefill, commit and free one request; returns its hit."""
    hit = m.create(rid, prompt)
    assert m.resize(rid, len(prompt) + 1, len(prompt))
    m.commit(rid, len(prompt))
    m.free(rid)
    return hit


def test_an_evicted_prefix_comes_back_from_the_host_tier() -> None:
    m = tiered(full_spec(tpb=TPB), {"full": 6}, host_pages=8)
    first = list(range(100, 120))  # 5 pages
    serve(m, 0, first)
    serve(m, 1, list(range(500, 520)))  # needs the GPU pages: the first prompt's go to the host
    offloaded = [e.block_hash for e in m.take_events() if e.kind == "stored" and e.medium == "CPU"]
    assert m.create(2, first + [7]) == 20  # all 5 pages: copied back from the host
    onboarded = [e.block_hash for e in m.take_events() if e.kind == "stored" and e.medium == "GPU"]
    assert sorted(onboarded) == sorted(offloaded[:5])  # into fresh GPU pages, under the same digests
    assert m.live_pages(2, "full") == 5
    m.check_integrity()


def test_sliding_pages_are_never_offloaded_but_full_ones_are() -> None:
    m = tiered(twin_spec(tpb=TPB, window=8), {"full": 8, "sliding": 8}, host_pages=16)
    serve(m, 0, list(range(100, 124)))
    serve(m, 1, list(range(500, 524)))
    stored = [e for e in m.take_events() if e.kind == "stored" and e.medium == "CPU"]
    assert stored and {e.group for e in stored} == {"full"}
    m.check_integrity()


prompts = st.lists(st.integers(0, 5), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(order=prompts, host=st.integers(0, 40), disk=st.integers(0, 20))
def test_reuse_across_tiers_equals_an_unbounded_gpu_pool(order: list[int], host: int, disk: int) -> None:
    # six prompts sharing prefixes of whole pages, served one at a time; a GPU pool of 8 pages with
    # enough cold pages behind it reuses exactly what a GPU pool that never evicts would
    base = list(range(1000, 1040))
    bank = [base[: 4 * (i + 2)] + [i] for i in range(5)] + [list(range(2000, 2021))]
    small = tiered(full_spec(tpb=TPB), {"full": 8}, host_pages=host, disk_pages=disk)
    big = KVCacheManager(PoolPlan.from_pages(full_spec(tpb=TPB), {"full": 4096}, ServingLimits(max_batch_size=8)))
    for rid, i in enumerate(order):
        a, b = serve(small, rid, bank[i]), serve(big, rid, bank[i])
        assert a <= b
        if host + disk >= 40:  # room for every page ever committed: nothing is lost
            assert a == b
        small.check_integrity()


def test_suspend_and_resume_keep_the_shape_and_move_the_pages() -> None:
    m = tiered(hybrid_spec(tpb=TPB, window=8), {"full": 20, "sliding": 20, "linear_state": 4}, host_pages=20)
    m.create(0, list(range(100, 130)))
    assert m.resize(0, 31, 30)
    live = {g.name: m.live_pages(0, g.name) for g in m.groups}
    free = {g.name: m.free_pages(g.name) for g in m.groups}
    assert m.suspend(0)
    s = m.suspension(0)
    assert s is not None and s.medium == "CPU"
    assert [len(x) for x in s.pages] == [len(x) for x in s.slots] == list(live.values())
    assert {g.name: m.free_pages(g.name) for g in m.groups} == {g: free[g] + live[g] for g in free}
    with pytest.raises(CacheUsageError, match="suspended"):
        m.resize(0, 32, 31)
    assert (m.capacity(0), m.history(0)) == (31, 30)
    m.check_integrity()
    assert m.resume(0)
    assert {g.name: m.live_pages(0, g.name) for g in m.groups} == live
    assert m.resize(0, 32, 31)
    m.check_integrity()


def test_resume_is_refused_only_above_max_util_already() -> None:
    """TensorRT-LLM V2 (`_KVCache.resume`) refuses when a pool group is already used
    beyond max_util_for_resume, not when the resume would take it there: at 80 of
    100 pages and 0.9, a 15-page request comes back (95 pages used after)."""
    m = tiered(full_spec(tpb=TPB), {"full": 100}, host_pages=20, max_util_for_resume=0.9)
    m.create(0)
    assert m.resize(0, 15 * TPB, 0)
    assert m.suspend(0)
    m.create(1)
    assert m.resize(1, 80 * TPB, 0)
    assert m.resume(0)
    assert m.live_pages(0, "full") == 15 and m.free_pages("full") == 5
    m.check_integrity()


def test_a_state_pool_never_refuses_a_resume_on_utilization() -> None:
    """A pool of state slots does not grow (one slot per request): above
    max_util_for_resume it still takes a resume while a slot is free."""
    groups = (
        LayerGroup("full", "full", (0,), TPB, row_bytes=64),
        LayerGroup("state", "state", (1,), TPB, state_bytes=256),
    )
    spec = ModelSpec("hybrid", "attention", groups, TPB, "bf16", 1, 2)
    m = tiered(spec, {"full": 100, "state": 4}, host_pages=100, max_util_for_resume=0.5)
    m.create(0)
    assert m.resize(0, TPB, 0)
    assert m.suspend(0)
    for rid in (1, 2, 3):  # 3 of the 4 slots taken: the state pool is at 0.75 > 0.5, one slot free
        m.create(rid)
        assert m.resize(rid, TPB, 0)
    assert m.resume(0)
    assert m.live_pages(0, "state") == 1
    m.check_integrity()


def test_a_refused_resume_or_suspend_changes_nothing() -> None:
    m = tiered(full_spec(tpb=TPB), {"full": 10}, host_pages=10, max_util_for_resume=0.5)
    m.create(0)
    assert m.resize(0, 16, 0)  # 4 pages
    assert m.suspend(0)
    m.create(1)
    assert m.resize(1, 24, 0)  # 6 pages used: above 0.5 x 10 already (V2 refuses only then)
    before = snapshot(m)
    done = m.resume(0)
    assert not done and done.short == {"full": 1}  # 6 - floor(0.5 x 10) pages to free first
    assert_unchanged(before, snapshot(m))
    m.free(1)
    assert m.resume(0)
    small = tiered(full_spec(tpb=TPB), {"full": 20}, host_pages=2)
    small.create(0)
    assert small.resize(0, 16, 0)
    before = snapshot(small)
    assert not small.suspend(0)  # 4 pages, 2 host slots
    assert_unchanged(before, snapshot(small))
    small.check_integrity()


ops = st.lists(
    st.tuples(st.sampled_from("crsRfx"), st.integers(0, 4), st.integers(0, 4)),
    min_size=5,
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(ops=ops, host=st.integers(0, 24), disk=st.integers(0, 12), hybrid=st.booleans())
def test_random_operations_keep_every_tier_consistent(
    ops: list[tuple[str, int, int]], host: int, disk: int, hybrid: bool
) -> None:
    spec = hybrid_spec(tpb=TPB, window=8) if hybrid else full_spec(tpb=TPB)
    pages = {"full": 12, "sliding": 12, "linear_state": 4} if hybrid else {"full": 12}
    m = tiered(spec, pages, host_pages=host, disk_pages=disk)
    bank = [list(range(100, 100 + 4 * (i + 2))) for i in range(5)]
    known: dict[int, int] = {}  # token ids each request has told the manager
    for op, rid, i in ops:
        if op == "c" and rid not in m:
            m.create(rid, bank[i])
            known[rid] = len(bank[i])
        elif op == "r" and rid in m and m.suspension(rid) is None:
            m.resize(rid, m.history(rid) + i + 1, m.history(rid) + i)
        elif op == "s" and rid in m and m.suspension(rid) is None:
            before = snapshot(m)
            if not m.suspend(rid):
                assert_unchanged(before, snapshot(m))
        elif op == "R" and rid in m and m.suspension(rid) is not None:
            before = snapshot(m)
            if not m.resume(rid):
                assert_unchanged(before, snapshot(m))
        elif op == "f" and rid in m:
            m.free(rid)
        elif op == "x" and rid in m and m.suspension(rid) is None:
            m.commit(rid, min(m.history(rid), known[rid]))
        m.check_integrity()


@settings(max_examples=60, deadline=None)
@given(order=prompts, host=st.integers(1, 8), disk=st.integers(0, 20))  # a small host tier: digests reach the disk
def test_every_page_and_slot_holds_what_its_digest_says(order: list[int], host: int, disk: int) -> None:
    # the "engine" writes a page's label (its digest) when it computes the page; every other content
    # arrives through the copies the manager asks for, and must match the digest it is filed under
    base = list(range(1000, 1040))
    bank = [base[: 4 * (i + 2)] + [i] for i in range(5)] + [list(range(2000, 2021))]
    m = tiered(full_spec(tpb=TPB), {"full": 8}, host_pages=host, disk_pages=disk)
    labels = Labels()
    m.set_tier_copies(labels)
    pool = m.pools[0]
    for rid, i in enumerate(order):
        hit = m.create(rid, bank[i])
        assert m.resize(rid, len(bank[i]) + 1, len(bank[i]))
        m.commit(rid, len(bank[i]))
        table = m.block_table(rid, "full").tolist()
        for block, page in enumerate(table):
            if block * TPB >= hit and pool.page_hash[page] is not None:  # computed now, not reused
                labels.gpu[0, page] = pool.page_hash[page]
        m.free(rid)
        for digest, page in pool.cached.items():
            assert labels.gpu[0, page] == digest
        assert m.tier is not None
        for level in m.tier.levels():
            for digest, slot in level.held[0].items():
                assert labels.tier[0, level.medium, slot] == digest
        m.check_integrity()
