"""`PagePool`: the pages of one pool group and the state of each page.

A page is in exactly one of three states:

- **free**: no owner and no reusable content; on the free stack;
- **owned**: `ref[page] > 0` requests hold it (it may also carry a hash when its
  content was committed, and then other requests may share it);
- **cached**: no owner but a committed hash, so a later request with the same
  prefix can take it back; kept in an LRU list and evicted (hash dropped) when
  the pool needs a page and the free stack is empty.

The storage of those states (`PageStore`) is separate from the pool that hands
pages out, so that several groups can draw from one store (`cache/shared_pool.py`).
The LRU is an intrusive doubly linked list over two integer lists (`prev`,
`nxt`) with a sentinel at index `num_pages`, so unlinking a cached page that a
request hits, appending a released page and evicting the oldest are O(1) and
allocate no Python objects. Pages move as runs: a release appends its pages as
one chain, an eviction cuts the oldest off the head with one splice, and a
prefix hit cuts out each stretch of its pages that lies together in the list
with one splice (the pages themselves still get one owner each).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvpool.cache.events import CacheUsageError, EventRecord
from kvpool.media import Medium

# The most pages (or tier slots) one group's books hold: each costs about 70 bytes
# of Python lists here, so 2**24 is over a GiB of bookkeeping. Past it the page
# size is too small for the memory (a larger tokens_per_block), or the memory a typo.
MAX_PAGES = 2**24


def check_pages(count: int, what: str) -> None:
    """CacheUsageError, before anything is allocated, for more than `MAX_PAGES` pages in `what`."""
    if count > MAX_PAGES:
        raise CacheUsageError(
            f"{what} would hold {count:,} pages, more than the {MAX_PAGES:,} a manager keeps books for; "
            "give less memory or a larger tokens_per_block"
        )


class PageStore:
    """The state of `num_pages` pages: owners, hashes, the free stack and the
    LRU of cached pages. Mutated only through the pools that draw from it."""

    __slots__ = ("name", "num_pages", "ref", "page_hash", "free_stack", "prev", "nxt", "lru_len")

    def __init__(self, name: str, num_pages: int) -> None:
        n = num_pages
        self.name = name
        self.num_pages = n
        self.ref = [0] * n
        self.page_hash: list[int | None] = [None] * n
        self.free_stack = list(range(n - 1, -1, -1))  # popped from the end, so page 0 is handed out first
        self.prev = [n] * (n + 1)
        self.nxt = [n] * (n + 1)
        self.lru_len = 0


class PagePool:
    """One group's pool: hands out pages of its `PageStore`, takes them back,
    and keeps the group's map from block hash to the page holding it.

    Methods mutate the pool; callers check `num_free` first (nothing here fails
    half-way). With `record_events`, every hash stored or dropped is logged in
    `events` as one record per run of pages (`cache/events.py`)."""

    __slots__ = (
        "name",
        "store",
        "num_pages",
        "ref",
        "page_hash",
        "free_stack",
        "prev",
        "nxt",
        "cached",
        "events",
        "record_events",
        "drops",
        "spill",
    )

    def __init__(self, name: str, store: PageStore, events: deque[EventRecord]) -> None:
        self.name = name
        self.store = store
        # the store's lists, bound here: the per-step paths read them without a second hop
        self.num_pages, self.ref, self.page_hash = store.num_pages, store.ref, store.page_hash
        self.free_stack, self.prev, self.nxt = store.free_stack, store.prev, store.nxt
        self.cached: dict[int, int] = {}  # block hash -> page holding it
        self.events = events
        self.record_events = True
        self.drops = 0  # entries `cached` has lost: a page found under a hash stays there while this is unchanged
        # where evicted digests go, with the pages that held them (a cold tier's `put`)
        self.spill: Callable[[list[int], list[int]], None] | None = None

    @property
    def num_free(self) -> int:
        """Pages an allocation can take now: free ones plus evictable cached ones."""
        return len(self.free_stack) + self.store.lru_len

    @property
    def evictions_seen(self) -> bool:
        """Whether anything reads what an eviction drops: an event record per
        eviction, or a cold tier's copy of the pages (`spill`)."""
        return self.record_events or self.spill is not None

    @property
    def num_cached(self) -> int:
        """Unowned pages that still hold reusable content (evictable)."""
        return self.store.lru_len

    # ------------------------------------------------------------------ LRU list

    def _unlink_oldest(self, count: int) -> list[int]:
        """Cut the `count` least recently released pages out of the LRU (one
        splice: they are its head) and return them, oldest first."""
        nxt, sentinel = self.nxt, self.num_pages
        pages, page = [], nxt[sentinel]
        for _ in range(count):
            pages.append(page)
            page = nxt[page]
        nxt[sentinel], self.prev[page] = page, sentinel
        self.store.lru_len -= count
        return pages

    def lru_order(self) -> list[int]:
        """Cached pages, least recently released first (the eviction order)."""
        out: list[int] = []
        sentinel = self.num_pages
        page = self.nxt[sentinel]
        while page != sentinel and len(out) <= self.num_pages:
            out.append(page)
            page = self.nxt[page]
        return out

    # ------------------------------------------------------------------ pages

    def take(self, count: int) -> list[int]:
        """Hand out `count` pages (ref 1): free ones first, then the least
        recently used cached pages (`evict`). The caller has checked
        `count <= num_free`."""
        stack, ref = self.free_stack, self.ref
        if count == 1 and stack:  # the decode step's page: no slicing
            page = stack.pop()
            ref[page] = 1
            return [page]
        if count and not stack:  # every page from the LRU (a full pool's usual case): no empty slice to join
            return self.evict(count)
        n_stack = min(count, len(stack))
        pages = stack[len(stack) - n_stack :]
        del stack[len(stack) - n_stack :]
        pages.reverse()
        for page in pages:
            ref[page] = 1
        if count > n_stack:  # (evicted pages get their owner in the eviction's own pass)
            pages += self.evict(count - n_stack)
        return pages

    def evict(self, count: int) -> list[int]:
        """Unlink the `count` least recently used cached pages, drop their
        hashes (one `removed` record) and hand them out with one owner each."""
        nxt, cached, ref, sentinel = self.nxt, self.cached, self.ref, self.num_pages
        # every cached page has a hash (were one None, `del cached[None]` would raise: never a key)
        page_hash: list[int] = self.page_hash  # type: ignore[assignment]
        keep = self.evictions_seen  # the digests are read only by a tier or a record
        pages, hashes = [0] * count, []
        page = nxt[sentinel]
        for i in range(count):  # `_unlink_oldest`, `_drop_hash` and the owner in one pass
            pages[i] = page
            block_hash = page_hash[page]
            if keep:
                hashes.append(block_hash)
            del cached[block_hash]
            page_hash[page] = None  # type: ignore[call-overload]
            ref[page] = 1
            page = nxt[page]
        nxt[sentinel], self.prev[page] = page, sentinel
        self.store.lru_len -= count
        self.drops += count
        if self.spill is not None:  # the copy is stored in a tier before the page's removal: a router
            self.spill(hashes, pages)  # never sees the digest held nowhere (and drop what hangs off it)
        if self.record_events:
            self.events.append(("removed", self.name, hashes, pages))
        return pages

    def take_cached(self, pages: Iterable[int]) -> None:
        """Add an owner to each page of a prefix hit (pages holding reusable
        content); the unowned ones leave the LRU a run at a time. A request's
        pages were released together, its table walked backwards (`free`), so
        a hit's consecutive pages are usually one stretch of the list in
        reverse order: each stretch is cut out with one splice."""
        ref, prev, nxt = self.ref, self.prev, self.nxt
        unlinked = 0
        newest = oldest = -1  # the open stretch's ends in LRU order (-1: none open)
        for page in pages:
            r = ref[page]
            ref[page] = r + 1
            if r:
                continue
            unlinked += 1
            if newest >= 0 and prev[oldest] == page:  # the stretch goes on one page earlier
                oldest = page
                continue
            if newest >= 0:  # links are read when a stretch is cut, so stretches may touch
                p, n = prev[oldest], nxt[newest]
                nxt[p], prev[n] = n, p
            newest = oldest = page
        if newest >= 0:
            p, n = prev[oldest], nxt[newest]
            nxt[p], prev[n] = n, p
        self.store.lru_len -= unlinked

    def release(self, pages: Sequence[int]) -> None:
        """Drop one owner of each page; an unowned page becomes cached (if it has
        a hash: appended to the LRU tail) or free."""
        ref, page_hash, free_stack = self.ref, self.page_hash, self.free_stack
        free, n_free = free_stack.append, len(free_stack)
        prev, nxt, sentinel = self.prev, self.nxt, self.num_pages
        kept, last = 0, prev[sentinel]
        for page in pages:
            left = ref[page] = ref[page] - 1
            if left:  # counted, the rare case: a count of the cached pages (past 256) allocates an int per page
                kept += 1
            elif page_hash[page] is None:
                free(page)
            else:  # appended to the LRU, chained: the tail is closed once, after the loop
                prev[page] = last
                nxt[last] = last = page
        nxt[last], prev[sentinel] = sentinel, last
        self.store.lru_len += len(pages) - kept - (len(free_stack) - n_free)

    def store_run(
        self,
        pages: Sequence[int],
        hashes: Sequence[int],
        first: int,
        num_tokens: int,
        source_page: int | None = None,
        ids: Sequence[int] | None = None,
        salt: object = None,
        ahead: int = 0,
    ) -> None:
        """Mark owned pages reusable: `pages[i]` is block `first + i`, under
        `hashes[first + i]` with parent `hashes[first + i - 1]` (None for block
        0). A page that already has a hash, a hash another page holds and an
        entry < 0 (no page) are skipped. One `stored` record per unbroken run;
        `source_page` (a state snapshot's source), the pages' token ids `ids`
        (one page's after the other, then the `ahead` ids after the last that
        lookahead digests cover) and the `salt` they were hashed under go into
        the record."""
        page_hash, cached, record = self.page_hash, self.cached, self.record_events
        if not record:  # no event: no run to track, each page stored or skipped on its own
            for page, h in zip(pages, hashes[first : first + len(pages)], strict=True):
                if page >= 0 and page_hash[page] is None and h not in cached:
                    page_hash[page] = h
                    cached[h] = page
            return
        start = 0
        for i, page in enumerate(pages):
            h = hashes[first + i]
            if page < 0 or page_hash[page] is not None or h in cached:
                if record:
                    self._stored(pages, hashes, first, start, i, num_tokens, source_page, ids, salt, ahead)
                start = i + 1
                continue
            page_hash[page] = h
            cached[h] = page
        if record:
            self._stored(pages, hashes, first, start, len(pages), num_tokens, source_page, ids, salt, ahead)

    def _stored(
        self,
        pages: Sequence[int],
        hashes: Sequence[int],
        first: int,
        a: int,
        b: int,
        num_tokens: int,
        source_page: int | None,
        ids: Sequence[int] | None,
        salt: object,
        ahead: int = 0,
    ) -> None:
        if b > a:
            parent = hashes[first + a - 1] if first + a else None
            run = pages if a == 0 and b == len(pages) else pages[a:b]
            width = (len(ids) - ahead) // len(pages) if ids is not None else 0
            record: tuple[Any, ...] = (
                "stored",
                self.name,
                list(hashes[first + a : first + b]),
                parent,
                list(run),
                num_tokens,
                source_page,
                Medium.GPU,
                None if ids is None else ids[a * width : b * width + ahead],
                salt,
            )
            self.events.append(record + (ahead,) if ahead and ids is not None else record)  # type: ignore[arg-type]

    def drop_cached(self, page: int) -> None:
        """Free cached (unowned) `page`: its content can no longer be trusted (a
        copy into it was cut short). One `removed` record."""
        p, n = self.prev[page], self.nxt[page]  # out of the LRU (a rare path: one page, no splice)
        self.nxt[p], self.prev[n] = n, p
        self.store.lru_len -= 1
        block_hash = self._drop_hash(page)
        self.free_stack.append(page)
        if self.record_events:
            self.events.append(("removed", self.name, [block_hash], [page]))

    def forget(self, page: int) -> None:
        """Drop a page's hash (its content is about to change); it stays owned."""
        if self.page_hash[page] is not None:
            block_hash = self._drop_hash(page)
            if self.record_events:
                self.events.append(("removed", self.name, [block_hash], [page]))

    def _drop_hash(self, page: int) -> int:
        block_hash = self.page_hash[page]
        assert block_hash is not None
        del self.cached[block_hash]
        self.page_hash[page] = None
        self.drops += 1
        return block_hash
