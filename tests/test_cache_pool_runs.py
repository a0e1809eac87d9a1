"""The pool's LRU moves pages as runs (a release's chain, an eviction's splice
off the head, a prefix hit's stretches cut out at once): checked against a
plain Python list of the cached pages, oldest first, under random releases,
hits in any order and evictions."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache.events import EventRecord
from kvpool.cache.pool import PagePool, PageStore


def links_agree(pool: PagePool) -> list[int]:
    """The LRU read forwards, after checking that reading it backwards gives the same pages."""
    forwards = pool.lru_order()
    backwards: list[int] = []
    page = pool.prev[pool.num_pages]
    while page != pool.num_pages and len(backwards) <= pool.num_pages:
        backwards.append(page)
        page = pool.prev[page]
    assert backwards[::-1] == forwards
    assert pool.num_cached == len(forwards)
    return forwards


class Model:
    """What the pool should hold: owners per page and the LRU as a list."""

    def __init__(self, n: int) -> None:
        self.ref = [0] * n
        self.hashed = [False] * n
        self.lru: list[int] = []

    def release(self, pages: list[int]) -> None:
        for p in pages:
            self.ref[p] -= 1
            if not self.ref[p] and self.hashed[p]:
                self.lru.append(p)

    def take_cached(self, pages: list[int]) -> None:
        for p in pages:
            if not self.ref[p]:
                self.lru.remove(p)
            self.ref[p] += 1


ops = st.lists(
    st.tuples(st.sampled_from(["take", "store", "release", "hit", "evict"]), st.integers(0, 10**6)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 24), script=ops)
def test_runs_match_a_list(n: int, script: list[tuple[str, int]]) -> None:
    pool = PagePool("g", PageStore("g", n), deque())
    model = Model(n)
    held: list[list[int]] = []  # each "request"'s pages, in table order
    next_hash = 1
    for op, x in script:
        if op == "take" and pool.num_free:
            count = 1 + x % pool.num_free
            evicted = pool.lru_order()[: max(0, count - len(pool.free_stack))]
            pages = pool.take(count)
            assert set(evicted) <= set(pages)
            for p in evicted:
                model.lru.remove(p)
                model.hashed[p] = False
            for p in pages:
                model.ref[p] = 1
            held.append(pages)
        elif op == "store" and held:
            pages = held[x % len(held)]
            hashes = list(range(next_hash, next_hash + len(pages)))
            next_hash += len(pages)
            pool.store_run(pages, hashes, 0, len(pages))
            for p in pages:
                model.hashed[p] = model.hashed[p] or pool.page_hash[p] is not None
        elif op == "release" and held:
            pages = held.pop(x % len(held))
            order = pages[::-1] if x % 2 else pages  # `free` walks a table backwards
            pool.release(order)
            model.release(order)
        elif op == "hit":
            cached = [p for p in range(n) if model.hashed[p]]
            if cached:  # any cached pages, owned or not, in an order drawn from x
                k = 1 + x % len(cached)
                pages = sorted(cached, key=lambda p: (p * (x | 1)) % 97)[:k]
                if x % 3 == 0:
                    pages = model.lru[::-1][:k]  # a released request's stretch, in table order
                pool.take_cached(pages)
                model.take_cached(pages)
                held.append(pages)
        elif op == "evict" and pool.num_cached:
            count = 1 + x % pool.num_cached
            oldest = model.lru[:count]
            assert pool.evict(count) == oldest
            del model.lru[:count]
            for p in oldest:  # handed out with one owner each, as `take` does
                model.hashed[p] = False
                model.ref[p] = 1
            held.append(oldest)
        assert links_agree(pool) == model.lru
        assert pool.ref == model.ref
        assert [h is not None for h in pool.page_hash] == model.hashed
        assert pool.num_free == len(pool.free_stack) + len(model.lru)


def test_taking_no_page_from_a_full_pool_changes_nothing() -> None:
    events: deque[EventRecord] = deque()
    pool = PagePool("g", PageStore("g", 3), events)
    pages = pool.take(3)
    pool.store_run(pages, [11, 12, 13], 0, 3)
    pool.release(pages)  # every page cached: the free stack is empty
    events.clear()
    assert pool.take(0) == [] and not events
    assert pool.num_cached == 3 and pool.lru_order() == pages


store_ops = st.lists(
    st.tuples(st.sampled_from(["take", "store", "release", "evict"]), st.integers(0, 10**6)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 16), script=store_ops)
def test_events_off_store_and_evict_as_the_recording_pool(n: int, script: list[tuple[str, int]]) -> None:
    """The pool without events (`store_run`'s loop that tracks no run, `evict`
    keeping no digests) ends every step in the state of the pool that records
    each run: pages already hashed, hashes another page holds and entries < 0
    skipped alike."""
    on, off = PagePool("g", PageStore("g", n), deque()), PagePool("g", PageStore("g", n), deque())
    off.record_events = False
    held: list[list[int]] = []
    for op, x in script:
        if op == "take" and on.num_free:
            count = 1 + x % on.num_free
            pages = on.take(count)
            assert off.take(count) == pages
            held.append(pages)
        elif op == "store" and held:
            pages = list(held[x % len(held)])
            if x % 5 == 0:
                pages[x % len(pages)] = -1  # an entry without a page
            first = x % 3
            hashes = [(x >> 2) % 7 + i % 4 for i in range(first + len(pages))]  # repeats: held elsewhere, or twice
            on.store_run(pages, hashes, first, len(pages))
            off.store_run(pages, hashes, first, len(pages))
        elif op == "release" and held:
            pages = held.pop(x % len(held))[::-1]
            on.release(pages)
            off.release(pages)
        elif op == "evict" and on.num_cached:
            count = 1 + x % on.num_cached
            pages = on.evict(count)
            assert off.evict(count) == pages
            held.append(pages)
        assert off.page_hash == on.page_hash and off.cached == on.cached
        assert off.ref == on.ref and off.lru_order() == on.lru_order() and off.drops == on.drops
    assert not off.events
