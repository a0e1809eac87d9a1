"""`PagedCache`: the part of `kvpool.cache.KVCacheManager` the scheduler drives.

Each method states what it changes and what it never changes. The safety rule
throughout: a call that refuses for lack of pages returns a falsy result
(`cache.results`) naming the pages short per group, and has changed nothing;
only usage errors (unknown ids, a shrinking history) raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvpool.cache.hashing import Salt
from kvpool.cache.results import CreateCheck, Dummies, Resize
from kvpool.cache.suspension import Suspension
from kvpool.spec import ModelSpec


class PagedCache(Protocol):
    """What the scheduler needs of a page manager."""

    spec: ModelSpec

    def create(self, rid: int, tokens: Sequence[int] | None = None, salt: Salt = None) -> int:
        """Register `rid` with no pages, or with the longest cached prefix of
        `tokens` attached (returns its length; capacity = history = it)."""
        ...

    def can_create(
        self, tokens: Sequence[int] | None = None, salt: Salt = None, num_tokens: int = 1, *, frozen: bool = False
    ) -> CreateCheck:
        """What `create(rid, tokens, salt)` then `resize(rid, hit + num_tokens,
        hit)` would answer: the hit, and the pages short per pool (falsy).
        Changes nothing: the LRU order stays as it was. `frozen`: `tokens` is
        never written again (only appended to), so it may be kept uncopied."""
        ...

    def resize(self, rid: int, capacity: int, history: int | None = None) -> Resize:
        """Move `rid` to (capacity, history): allocates and releases pages in
        every group, or changes nothing."""
        ...

    def resize_many(
        self, rids: Sequence[int], capacities: Sequence[int], histories: Sequence[int] | None = None
    ) -> Resize:
        """`resize` for a batch, atomic over the whole batch."""
        ...

    def extend(self, rids: Sequence[int], num_tokens: int = 1) -> Resize:
        """Advance capacity and history of each of `rids` by `num_tokens`, atomically."""
        ...

    def commit(self, rid: int, num_tokens: int, tokens: Sequence[int] | None = None) -> int:
        """Offer the computed whole pages among the first `num_tokens` for reuse;
        allocates nothing and never changes a request's shape."""
        ...

    def free(self, rid: int) -> None:
        """Release every page of `rid` and forget it (cached pages stay reusable)."""
        ...

    def capacity(self, rid: int) -> int:
        """Positions `rid` has slots for (no side effects)."""
        ...

    def free_pages(self, group: str) -> int:
        """Pages an allocation in `group` could take now (no side effects)."""
        ...

    def live_pages(self, rid: int, group: str) -> int:
        """Pages `rid` holds in `group` now (no side effects)."""
        ...

    def pool_of(self, group: str) -> str:
        """The pool `group` draws from: its own name, or a pool it shares with
        other groups (which then report the same free pages); no side effects."""
        ...

    def unused_pages(self, group: str) -> int:
        """Pages an allocation in `group` could take without evicting a
        cached page (no side effects)."""
        ...

    def first_shared_fill(self, rid: int, tokens: Sequence[int], upto: int) -> int | None:
        """The first history up to `upto` at which `rid`, its history growing
        with `tokens` after the ids the manager has, fills a page whose commit
        depends on the evictions made before it (a page another page holds
        the digest of); None for none. No side effects."""
        ...

    def add_dummy_requests(self, batch_size: int, token_num: int, draft_len: int = 0, is_gen: bool = True) -> Dummies:
        """Register `batch_size` dummies, all or none (each freed with `free`)."""
        ...


class SuspendingCache(PagedCache, Protocol):
    """A `PagedCache` with a cold tier to park a preempted request's pages in
    (`Scheduler(preemption="suspend")`)."""

    def suspend(self, rid: int) -> Resize:
        """Copy `rid`'s pages to a cold tier and release them on the device; the
        request keeps its shape. Falsy, changing nothing, when no tier has room."""
        ...

    def resume(self, rid: int) -> Resize:
        """Bring a suspended `rid`'s pages back to the device. Falsy, changing
        nothing, when the device pools cannot take them now."""
        ...

    def suspension(self, rid: int) -> Suspension | None:
        """What `rid` has parked in a cold tier (None: not suspended); no side effects."""
        ...
