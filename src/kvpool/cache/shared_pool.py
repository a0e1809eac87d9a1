"""One page pool serving several groups (vLLM v1's shared block pool).

`PoolView` is a `PagePool` whose page storage (reference counts, page hashes,
free stack, LRU links) is shared with the other views of one `SharedPages`;
only the hash -> page map (`cached`) is the view's own, so a prefix hit in one
group never finds a page another group cached (two groups' chains may carry
equal hashes: they never alias). An eviction drops the hash from the map of the
group that cached the page. Pages are counted once: every view reports the
shared pool's `num_pages`, `num_free` and `num_cached`.

`build_pools` gives the manager one pool per group, views where the plan
shares a pool (`PoolPlan.shared`); `shared_shortfall` turns a planned resize's
per-group needs into the pages short per shared pool (rule 6 across groups).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from kvpool.cache.events import EventRecord
from kvpool.cache.pool import PagePool
from kvpool.plan.result import PoolPlan


class SharedPages:
    """The storage of one shared pool: `num_pages` slots, one free stack, one
    LRU of cached pages (sentinel at `num_pages`), and for each cached page the
    view whose map holds its hash (`holder`). Mutated only through its views."""

    def __init__(self, name: str, num_pages: int) -> None:
        n = num_pages
        self.name = name
        self.num_pages = n
        self.ref = [0] * n
        self.page_hash: list[int | None] = [None] * n
        self.free_stack = list(range(n - 1, -1, -1))  # popped from the end: page 0 first
        self.prev = [n] * (n + 1)
        self.nxt = [n] * (n + 1)
        self.lru_len = 0
        self.holder: list[PoolView | None] = [None] * n
        self.views: list[PoolView] = []


class PoolView(PagePool):
    """Group `name`'s face of a `SharedPages`: takes and releases the shared
    pages, keeps its own hash map. Same methods and side effects as `PagePool`."""

    __slots__ = ("shared",)

    def __init__(self, name: str, shared: SharedPages, events: deque[EventRecord]) -> None:
        # PagePool.__init__ would allocate private storage: bind the shared lists instead
        self.shared = shared
        self.name = name
        self.num_pages = shared.num_pages
        self.ref = shared.ref
        self.page_hash = shared.page_hash
        self.free_stack = shared.free_stack
        self.prev = shared.prev
        self.nxt = shared.nxt
        self.cached = {}
        self.events = events
        self.record_events = True
        self.drops = 0
        shared.views.append(self)

    @property  # type: ignore[override]
    def lru_len(self) -> int:
        """Cached pages in the shared LRU (all groups')."""
        return self.shared.lru_len

    @lru_len.setter
    def lru_len(self, value: int) -> None:
        self.shared.lru_len = value

    def store(
        self, page: int, block_hash: int, parent_hash: int | None, num_tokens: int, source_page: int | None = None
    ) -> bool:
        """`PagePool.store`, remembering that this view's map holds the hash."""
        if not super().store(page, block_hash, parent_hash, num_tokens, source_page):
            return False
        self.shared.holder[page] = self
        return True

    def store_chain(self, pages: list[int], hashes: list[int], first: int, num_tokens: int) -> None:
        """`PagePool.store_chain`, remembering that this view's map holds each hash it stored."""
        super().store_chain(pages, hashes, first, num_tokens)
        holder, cached = self.shared.holder, self.cached
        for i, page in enumerate(pages):
            if page >= 0 and cached.get(hashes[first + i]) == page:
                holder[page] = self

    def take(self, count: int) -> list[int]:
        """`PagePool.take`; a cached page it evicts may be another group's, so
        each eviction's `removed` record names the group whose map held it."""
        n_stack = len(self.free_stack)
        if count <= n_stack:
            return super().take(count)
        pages = super().take(n_stack) if n_stack else []
        for _ in range(count - n_stack):
            page = self.nxt[self.num_pages]
            self._lru_unlink(page)
            holder = self.shared.holder[page]
            block_hash = self._drop_hash(page)
            if holder is not None and holder.record_events:
                holder.events.append(("removed", holder.name, [block_hash], [page]))
            self.ref[page] = 1
            pages.append(page)
        return pages

    def _drop_hash(self, page: int) -> int:
        """Drop a page's hash from the map of the view that cached it (an
        eviction in one group may take another group's cached page)."""
        holder = self.shared.holder[page]
        assert holder is not None
        self.shared.holder[page] = None
        block_hash = holder.page_hash[page]
        assert block_hash is not None
        del holder.cached[block_hash]
        holder.page_hash[page] = None
        holder.drops += 1
        return block_hash


def build_pools(plan: PoolPlan, events: deque[EventRecord]) -> list[PagePool]:
    """One pool per group of `plan.spec`, in group order: a `PagePool` of
    `plan.pages(group)` pages, or a `PoolView` of the plan's shared pool."""
    storages = {s.name: SharedPages(s.name, s.pages) for s in plan.shared}
    pools: list[PagePool] = []
    for g in plan.spec.groups:
        pool = plan.pool_of(g.name)
        if pool in storages:
            pools.append(PoolView(g.name, storages[pool], events))
        else:
            pools.append(PagePool(g.name, plan.pages(g.name), events))
    return pools


def is_shared(pools: Sequence[PagePool]) -> bool:
    """Whether any of `pools` is a view of a shared pool."""
    return any(isinstance(p, PoolView) for p in pools)


class PlannedChange(Protocol):
    """What `shared_shortfall` reads of a planned table change."""

    new: int
    release: list[int]


def shared_shortfall(
    pools: Sequence[PagePool], plans: Sequence[Sequence[PlannedChange]], short: dict[str, int]
) -> dict[str, int]:
    """Pages short per pool for planned changes (`plans[group]`): groups that
    share a pool are summed and reported once, under the shared pool's name;
    `short` (per-group answers) is kept for groups with pools of their own."""
    need: dict[str, int] = {}
    released: dict[str, dict[int, int]] = {}
    storage: dict[str, SharedPages] = {}
    out = {k: v for k, v in short.items() if k not in {p.name for p in pools if isinstance(p, PoolView)}}
    for pool, changes in zip(pools, plans, strict=True):
        if not isinstance(pool, PoolView):
            continue
        name = pool.shared.name
        storage[name] = pool.shared
        need[name] = need.get(name, 0) + sum(ch.new for ch in changes)
        count = released.setdefault(name, {})
        for ch in changes:
            for p in ch.release:
                count[p] = count.get(p, 0) + 1
    for name, n in need.items():
        s = storage[name]
        free = len(s.free_stack) + s.lru_len
        if n > free:
            # a released page whose every owner lets go becomes allocatable again
            missing = n - free - sum(1 for p, c in released[name].items() if s.ref[p] == c)
            if missing > 0:
                out[name] = missing
    return out
