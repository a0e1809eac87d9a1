"""A copy the engine fails (its `TierCopies` method raises: a DMA that failed)
never leaves the books inconsistent (cache/rollback.py). A failed suspend,
resume or prefix hit copied in from a tier undoes the call: the requests, their
pages, the pins and the free pages are as before it, and the books equal the
snapshot taken before it except the cached pages the cut-short copies wrote over,
which are dropped, and the digests moved one level down to make room (a cached
GPU page a resume or hit evicted, a tier's LRU digest a suspend pushed down). A failed offload only loses that cached page. Checked against
what each page and slot really holds: the copies move labels, and a failing copy
first scribbles on its destination, as a half-done DMA would."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, hybrid_spec
from kvpool.cache import KVCacheManager
from tier_helpers import TPB, DmaFailed, Flaky, assert_every_label_true, books, computed, requests_and_pins, tiered


def test_a_failed_suspend_with_room_to_spare_leaves_the_books_exactly_as_before() -> None:
    m = tiered(full_spec(tpb=TPB), {"full": 16}, host_pages=16)
    labels = Flaky({("to_tier", 1)})  # the second page's copy fails
    m.set_tier_copies(labels)
    m.create(0, list(range(100, 117)))
    assert m.resize(0, 18, 17)
    m.commit(0, 17)
    computed(m, labels, 0, 0)
    before = books(m)
    with pytest.raises(DmaFailed):
        m.suspend(0)
    assert books(m) == before
    m.check_integrity()
    assert m.suspend(0) and m.resume(0)  # the copies work again: so does the call
    m.check_integrity()


def test_a_failed_resume_with_free_pages_leaves_the_books_exactly_as_before() -> None:
    m = tiered(full_spec(tpb=TPB), {"full": 16}, host_pages=16)
    labels = Flaky({("to_gpu", 1)})  # the second page copied back fails
    m.set_tier_copies(labels)
    m.create(0, list(range(100, 113)))
    assert m.resize(0, 14, 13)
    m.commit(0, 13)
    computed(m, labels, 0, 0)
    assert m.suspend(0)
    before = books(m)
    with pytest.raises(DmaFailed):
        m.resume(0)
    assert books(m) == before
    m.check_integrity()
    assert m.resume(0)


def suspended_beside_seven_cached_pages(m: KVCacheManager) -> Flaky:
    """Request 0 (4 pages) suspended, then request 1's 8 pages computed and
    freed: seven cached pages and one free, so resuming 0 evicts 3. Returns
    the labels the tiers copy with."""
    labels = Flaky()
    m.set_tier_copies(labels)
    m.create(0, list(range(100, 113)))
    assert m.resize(0, 14, 13)
    m.commit(0, 13)
    computed(m, labels, 0, 0)
    assert m.suspend(0)
    hit = m.create(1, list(range(500, 532)))
    assert m.resize(1, 32, 31)
    m.commit(1, 31)
    computed(m, labels, 1, hit)
    m.free(1)
    return labels


def test_a_failed_resume_that_evicted_loses_no_content() -> None:
    """Resuming takes the free page, then three cached GPU pages (their content
    offloaded to the host tier first); the copy into the third taken page fails
    after scribbling on it: the request stays suspended, its pins kept, the four
    pages go back to the free list, and the three evicted digests live on in the
    host tier, where every label is still true."""
    m = tiered(full_spec(tpb=TPB), {"full": 8}, host_pages=8)
    labels = suspended_beside_seven_cached_pages(m)
    labels.fail = {("to_gpu", 2)}
    before = books(m)
    with pytest.raises(DmaFailed):
        m.resume(0)
    after = books(m)
    assert m.suspension(0) is not None and after["tiers"][0][2] == before["tiers"][0][2]  # still suspended, pinned
    lost = set(before["observed"]["full"][1]) - set(after["observed"]["full"][1])
    assert m.tier is not None and len(lost) == 3 and lost <= set(m.tier.held[0])
    assert m.free_pages("full") == 8
    m.check_integrity()
    assert_every_label_true(m, labels)
    assert m.resume(0)


def test_a_failed_resume_that_evicted_past_a_pinned_host_tier_keeps_them_on_disk() -> None:
    """As above, but the suspended request's pins fill the host tier: the three
    cached GPU pages the resume evicts go one tier further down, to disk, and stay
    there when the copy fails (a tier then holds digests no tier held before the
    call; only the GPU pool did)."""
    m = tiered(full_spec(tpb=TPB), {"full": 8}, host_pages=4, disk_pages=8)
    labels = suspended_beside_seven_cached_pages(m)
    labels.fail = {("to_gpu", 2)}
    before = books(m)
    assert before["tiers"][0][1] == [[]]  # the host tier: no free slot, every one pinned
    with pytest.raises(DmaFailed):
        m.resume(0)
    after = books(m)
    assert m.suspension(0) is not None and after["tiers"][0] == before["tiers"][0]
    lost = set(before["observed"]["full"][1]) - set(after["observed"]["full"][1])
    assert m.tier is not None and len(lost) == 3
    disk_before = {digest for digest, _ in before["tiers"][1][0][0]}
    disk_after = {digest for digest, _ in after["tiers"][1][0][0]}
    assert disk_after - disk_before == lost
    m.check_integrity()
    assert_every_label_true(m, labels)
    assert m.resume(0)


def test_a_failed_hit_from_the_host_tier_leaves_the_books_exactly_as_before() -> None:
    """The hit's fresh pages come off the free list (nothing evicted for them):
    the books after the failed copy equal the snapshot before the call."""
    m = tiered(full_spec(tpb=TPB), {"full": 8}, host_pages=8)
    labels = Flaky()
    m.set_tier_copies(labels)
    first = list(range(100, 120))
    m.create(0, first)
    assert m.resize(0, 21, 20)
    m.commit(0, 20)
    computed(m, labels, 0, 0)
    m.free(0)
    m.create(1)  # no tokens: takes every page (the first prompt's go to the host), frees them for good
    assert m.resize(1, 32, 0)
    m.free(1)
    labels.fail = {("to_gpu", 2)}  # the third page copied back fails
    before = books(m)
    with pytest.raises(DmaFailed):
        m.create(2, first + [7])
    assert 2 not in m and books(m) == before
    m.check_integrity()
    assert m.create(2, first + [7]) == 20


def test_a_failed_hit_that_evicted_drops_what_it_wrote_over() -> None:
    """The hit's fresh GPU pages are cached pages evicted for it; the copy into the
    third fails after scribbling on it: the books come back, except the two cached
    pages written over, whose digests are dropped (a later hit would read the
    other prompt's rows under them), and every label is true."""
    m = tiered(full_spec(tpb=TPB), {"full": 6}, host_pages=12)
    labels = Flaky()
    m.set_tier_copies(labels)
    first, second = list(range(100, 120)), list(range(500, 520))
    for rid, prompt in enumerate([first, second]):
        hit = m.create(rid, prompt)
        assert m.resize(rid, 21, 20)
        m.commit(rid, 20)
        computed(m, labels, rid, hit)
        m.free(rid)
    labels.fail = {("to_gpu", 2)}
    before = books(m)
    with pytest.raises(DmaFailed):
        m.create(2, first + [7])
    after = books(m)
    assert 2 not in m
    lost = set(before["observed"]["full"][1]) - set(after["observed"]["full"][1])
    assert len(lost) == 2 and lost <= set(second_digests(m, second))
    m.check_integrity()
    assert_every_label_true(m, labels)
    assert m.create(2, first + [7]) == 20


def second_digests(m: KVCacheManager, prompt: list[int]) -> list[int]:
    """The digests of `prompt`'s whole pages, as the manager files them."""
    probe = KVCacheManager(m.plan)
    probe.create(0, prompt)
    assert probe.resize(0, len(prompt) + 1, len(prompt))
    probe.commit(0, len(prompt))
    return [h for h in probe.pools[0].page_hash if h is not None]


ops = st.lists(st.tuples(st.sampled_from("cccfsR"), st.integers(0, 5), st.integers(0, 5)), min_size=5, max_size=50)


@settings(max_examples=150, deadline=None)
@given(ops=ops, host=st.integers(1, 24), disk=st.integers(0, 12), hybrid=st.booleans(), seed=st.integers(0, 2**16))
# a suspend whose copy fails after the host tier moved a digest to disk to make room for it
@example(ops=[("c", 0, 0), ("c", 1, 3), ("f", 0, 0), ("c", 0, 2), ("s", 0, 0)], host=6, disk=2, hybrid=True, seed=2)
# a resume whose copy fails after it evicted a cached GPU page to the disk tier (the host tier
# has no slot for that group), which dropped its LRU digest to make room
@example(
    ops=[("c", 4, 0), ("c", 0, 0), ("s", 0, 0), ("s", 4, 0), ("c", 1, 5), ("f", 1, 0), ("R", 4, 0)],
    host=1,
    disk=5,
    hybrid=True,
    seed=167,
)
def test_random_operations_with_failing_copies_keep_the_books(
    ops: list[tuple[str, int, int]], host: int, disk: int, hybrid: bool, seed: int
) -> None:
    spec = hybrid_spec(tpb=TPB, window=8) if hybrid else full_spec(tpb=TPB)
    pages = {"full": 12, "sliding": 12, "linear_state": 4} if hybrid else {"full": 12}
    m = tiered(spec, pages, host_pages=host, disk_pages=disk)
    labels = Flaky(0.2, seed)
    m.set_tier_copies(labels)
    bank = [list(range(100, 100 + 4 * (i + 2))) + [i] for i in range(6)]
    for op, rid, i in ops:
        before, kept = books(m), requests_and_pins(m)
        try:
            if op == "c" and rid not in m:
                hit = m.create(rid, bank[i])
                if m.resize(rid, len(bank[i]) + 1, len(bank[i])):
                    m.commit(rid, len(bank[i]))
                    computed(m, labels, rid, hit)
            elif op == "f" and rid in m:
                m.free(rid)
            elif op == "s" and rid in m and m.suspension(rid) is None:
                m.suspend(rid)
            elif op == "R" and rid in m and m.suspension(rid) is not None:
                m.resume(rid)
        except DmaFailed:
            after = books(m)
            assert requests_and_pins(m) == kept  # the call is undone
            for pool in m.pools:  # the cache only lost entries a copy wrote over
                assert set(after["observed"][pool.name][1]) - {None} <= set(before["observed"][pool.name][1])
            # a tier only lost digests, or holds one a warmer level (the GPU pool first) held
            # before: room made stays made, a cached GPU page a resume or hit evicted for its
            # pages and a tier's LRU digest a suspend pushed down (ColdStore: moved down, copied)
            warmer = [set(before["observed"][pool.name][1]) - {None} for pool in m.pools]
            for (held_a, _, _), (held_b, _, _) in zip(after["tiers"], before["tiers"], strict=True):
                for gi, (a, b) in enumerate(zip(held_a, held_b, strict=True)):
                    warmer[gi] |= {digest for digest, _ in b}
                    assert {digest for digest, _ in a} <= warmer[gi]
        m.check_integrity()
        assert_every_label_true(m, labels)
    stats = m.stats()
    assert stats.extra["failed_tier_copies"] >= 0


def test_set_tier_copies_refuses_what_cannot_copy() -> None:
    """`set_tier_copies(42)` was accepted and the first suspend crashed half-way."""
    from kvpool.cache import CacheUsageError

    m = tiered(full_spec(tpb=TPB), {"full": 8}, host_pages=8)
    for bad in (42, None, "copies", object()):
        with pytest.raises(CacheUsageError, match="to_tier"):
            m.set_tier_copies(bad)  # type: ignore[arg-type]
    assert m.tier is not None and m.tier.copies is None
