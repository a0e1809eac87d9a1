"""One page store serving several groups (vLLM v1's shared block pool).

Each group that draws from a shared store has a `SharedPool`: a `PagePool` over
the common `PageStore` (owners, hashes, free stack, LRU), with a hash -> page
map of its own, so a prefix hit in one group never finds a page another group
cached (two groups' chains may carry equal hashes: they never alias). An
eviction drops the hash from the map of the group that cached the page, and the
`removed` record names that group. Pages are counted once: every group reports
the store's `num_pages`, `num_free` and `num_cached`.

`build_pools` gives the manager one pool per group, shared ones where the plan
shares a pool (`PoolPlan.shared`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kvpool.cache.events import EventRecord
from kvpool.cache.pool import PagePool, PageStore
from kvpool.plan.result import PoolPlan


class SharedStore(PageStore):
    """A `PageStore` several groups draw from, knowing for each cached page the
    pool whose map holds its hash (`holder`)."""

    __slots__ = ("holder",)

    def __init__(self, name: str, num_pages: int) -> None:
        super().__init__(name, num_pages)
        self.holder: list[SharedPool | None] = [None] * num_pages


class SharedPool(PagePool):
    """Group `name`'s pool over a `SharedStore`: same methods and side effects
    as `PagePool`, except that an eviction may take (and report) another
    group's cached page."""

    __slots__ = ()
    store: SharedStore

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
        """`PagePool.store_run`, remembering that this pool's map holds each hash it stored."""
        super().store_run(pages, hashes, first, num_tokens, source_page, ids, salt, ahead)
        holder, cached = self.store.holder, self.cached
        for i, page in enumerate(pages):
            if page >= 0 and cached.get(hashes[first + i]) == page:
                holder[page] = self

    def evict(self, count: int) -> list[int]:
        """`PagePool.evict`, each page's `removed` record under the group whose map held it."""
        pages, ref = self._unlink_oldest(count), self.ref
        for page in pages:
            ref[page] = 1
            holder = self.store.holder[page]
            block_hash = self._drop_hash(page)
            if holder is not None and holder.record_events:
                holder.events.append(("removed", holder.name, [block_hash], [page]))
        return pages

    def _drop_hash(self, page: int) -> int:
        """Drop a page's hash from the map of the pool that cached it."""
        holder = self.store.holder[page]
        assert holder is not None
        self.store.holder[page] = None
        block_hash = holder.page_hash[page]
        assert block_hash is not None
        del holder.cached[block_hash]
        holder.page_hash[page] = None
        holder.drops += 1
        return block_hash


def build_pools(plan: PoolPlan, events: deque[EventRecord]) -> list[PagePool]:
    """One pool per group of `plan.spec`, in group order: a `PagePool` of
    `plan.pages(group)` pages, or a `SharedPool` over the plan's shared store."""
    stores = {s.name: SharedStore(s.name, s.pages) for s in plan.shared}
    pools: list[PagePool] = []
    for g in plan.spec.groups:
        shared = stores.get(plan.pool_of(g.name))
        if shared is not None:
            pools.append(SharedPool(g.name, shared, events))
        else:
            pools.append(PagePool(g.name, PageStore(g.name, plan.pages(g.name)), events))
    return pools
