"""`PagePool`: the slots of one pool group and the state of each page.

A page is in exactly one of three states:

- **free**: no owner and no reusable content; on the free stack;
- **owned**: `ref[page] > 0` requests hold it (it may also carry a hash when its
  content was committed, and then other requests may share it);
- **cached**: no owner but a committed hash, so a later request with the same
  prefix can take it back; kept in an LRU list and evicted (hash dropped) when
  the pool needs a page and the free stack is empty.

The LRU is an intrusive doubly linked list over two integer lists (`prev`,
`nxt`) with a sentinel at index `num_pages`, so unlinking a cached page that a
request hits, appending a released page and evicting the oldest are O(1) and
allocate no Python objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvpool.cache.events import EventRecord


class PagePool:
    """Slots of one pool group. Methods mutate the pool; callers check
    `num_free` first (nothing here fails half-way)."""

    __slots__ = (
        "name",
        "num_pages",
        "ref",
        "page_hash",
        "free_stack",
        "prev",
        "nxt",
        "lru_len",
        "cached",
        "events",
        "record_events",
        "drops",
    )

    def __init__(self, name: str, num_pages: int, events: deque[EventRecord]) -> None:
        n = num_pages
        self.name = name
        self.num_pages = n
        self.ref = [0] * n
        self.page_hash: list[int | None] = [None] * n
        # popped from the end, so page 0 is handed out first
        self.free_stack = list(range(n - 1, -1, -1))
        self.prev = [n] * (n + 1)
        self.nxt = [n] * (n + 1)
        self.lru_len = 0
        self.cached: dict[int, int] = {}  # block hash -> page holding it
        self.events = events  # a log of `EventRecord`s, one per run of pages (`cache/events.py`)
        self.record_events = True
        self.drops = 0  # entries `cached` has lost: a page found under a hash stays there while this is unchanged

    @property
    def num_free(self) -> int:
        """Pages an allocation can take now: free ones plus evictable cached ones."""
        return len(self.free_stack) + self.lru_len

    @property
    def num_cached(self) -> int:
        """Unowned pages that still hold reusable content (evictable)."""
        return self.lru_len

    # ------------------------------------------------------------------ LRU list

    def _lru_append(self, page: int) -> None:
        sentinel = self.num_pages
        last = self.prev[sentinel]
        self.prev[page] = last
        self.nxt[page] = sentinel
        self.nxt[last] = page
        self.prev[sentinel] = page
        self.lru_len += 1

    def _lru_unlink(self, page: int) -> None:
        p, n = self.prev[page], self.nxt[page]
        self.nxt[p] = n
        self.prev[n] = p
        self.lru_len -= 1

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
        """Hand out `count` pages (ref 1): free ones first, then evict the least
        recently used cached pages (each eviction drops its hash; one `removed`
        record for them all). The caller has checked `count <= num_free`."""
        stack = self.free_stack
        n_stack = min(count, len(stack))
        pages = stack[len(stack) - n_stack :]
        del stack[len(stack) - n_stack :]
        pages.reverse()
        if count > n_stack:
            evicted, hashes = [], []
            for _ in range(count - n_stack):
                page = self.nxt[self.num_pages]
                self._lru_unlink(page)
                hashes.append(self._drop_hash(page))
                evicted.append(page)
            if self.record_events:
                self.events.append(("removed", self.name, hashes, evicted))
            pages += evicted
        ref = self.ref
        for page in pages:
            ref[page] = 1
        return pages

    def take_one(self) -> int:
        """`take(1)`, without building a list when a free page is on the stack
        (the decode step's allocation)."""
        if self.free_stack:
            page = self.free_stack.pop()
            self.ref[page] = 1
            return page
        return self.take(1)[0]

    def take_cached(self, page: int) -> None:
        """Add an owner to a page holding reusable content (a prefix hit)."""
        if self.ref[page] == 0:
            self._lru_unlink(page)
        self.ref[page] += 1

    def take_cached_many(self, pages: Iterable[int]) -> None:
        """`take_cached` for each page of a prefix hit (one call for a long prompt)."""
        ref = self.ref
        for page in pages:
            r = ref[page]
            if not r:
                self._lru_unlink(page)
            ref[page] = r + 1

    def release_one(self, page: int) -> None:
        """`release((page,))` without the loop (a page leaving a sliding window)."""
        left = self.ref[page] - 1
        self.ref[page] = left
        if left == 0:
            if self.page_hash[page] is None:
                self.free_stack.append(page)
            else:
                self._lru_append(page)

    def release(self, pages: Iterable[int]) -> None:
        """Drop one owner of each page; an unowned page becomes cached (if it has
        a hash: appended to the LRU tail) or free."""
        ref, page_hash, free = self.ref, self.page_hash, self.free_stack.append
        prev, nxt, sentinel = self.prev, self.nxt, self.num_pages
        cached, last = 0, prev[sentinel]
        for page in pages:
            left = ref[page] - 1
            ref[page] = left
            if left == 0:
                if page_hash[page] is None:
                    free(page)
                else:  # `_lru_append`, inlined and chained: the tail is closed once, after the loop
                    prev[page] = last
                    nxt[last] = last = page
                    cached += 1
        nxt[last], prev[sentinel] = sentinel, last
        self.lru_len += cached

    def store(
        self, page: int, block_hash: int, parent_hash: int | None, num_tokens: int, source_page: int | None = None
    ) -> bool:
        """Mark an owned page's content reusable under `block_hash`; False (no
        change) if the page already has a hash or another page holds this one."""
        if self.page_hash[page] is not None or block_hash in self.cached:
            return False
        self.page_hash[page] = block_hash
        self.cached[block_hash] = page
        if self.record_events:
            self.events.append(("stored", self.name, [block_hash], parent_hash, [page], num_tokens, source_page))
        return True

    def store_chain(self, pages: list[int], hashes: list[int], first: int, num_tokens: int) -> None:
        """`store` each page of a run of consecutive blocks: `pages[i]` is block
        `first + i`, under `hashes[first + i]` with parent `hashes[first + i - 1]`
        (None for block 0); entries < 0 (no page) are skipped. One event record
        per unbroken run of stored pages."""
        page_hash, cached = self.page_hash, self.cached
        start = 0
        for i, page in enumerate(pages):
            h = hashes[first + i]
            if page < 0 or page_hash[page] is not None or h in cached:
                if i > start:
                    self._stored_run(pages, hashes, first, start, i, num_tokens)
                start = i + 1
                continue
            page_hash[page] = h
            cached[h] = page
        if start == 0 and pages and self.record_events:  # the common case: one run, the list as it is
            parent = hashes[first - 1] if first else None
            self.events.append(
                ("stored", self.name, hashes[first : first + len(pages)], parent, pages, num_tokens, None)
            )
        elif len(pages) > start:
            self._stored_run(pages, hashes, first, start, len(pages), num_tokens)

    def _stored_run(self, pages: list[int], hashes: list[int], first: int, a: int, b: int, num_tokens: int) -> None:
        if self.record_events:
            parent = hashes[first + a - 1] if first + a else None
            self.events.append(
                ("stored", self.name, hashes[first + a : first + b], parent, pages[a:b], num_tokens, None)
            )

    def lookup(self, block_hash: int) -> int | None:
        """The page holding `block_hash`, or None."""
        return self.cached.get(block_hash)

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
