"""`KVCacheManager`: the public face of the run-time page manager.

`KVCacheCore` (`cache/core.py`) holds requests and their pages, one request
at a time; the manager adds the batched moves (`resize_many`, `extend`),
dummy requests, the capacity query and the CUDA-graph warmup dry run
(`cache/warmup.py`), the persistent padding dummies, events, the integrity
check and statistics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from kvpool.cache import batch, integrity
from kvpool.cache import warmup as warmup_mod
from kvpool.cache.checks import as_position, batch_positions, check_batch_shapes, checked_shape
from kvpool.cache.core import KVCacheCore
from kvpool.cache.events import CacheEvent, CacheStats, CacheUsageError, GroupStats, expand
from kvpool.cache.results import RESIZED, Dummies, Resize
from kvpool.cache.slots import STALE
from kvpool.cache.warmup import WarmupReport
from kvpool.plan.result import PoolPlan

__all__ = ["STALE", "KVCacheManager"]


class KVCacheManager(KVCacheCore):
    """Run-time pages of a `PoolPlan` (see `KVCacheCore` for requests, resizes
    and reuse), plus dummies and warmup: `add_dummy_requests`,
    `max_generation_length`, `warmup` and the persistent padding dummies it
    reserves (`reserve_padding_dummy`); and the readers: block tables, pages
    free, total and live, `stats` and `check_integrity`.
    """

    def __init__(
        self, plan: PoolPlan, *, enable_reuse: bool = True, state_snapshots: bool = False, events: bool = True
    ) -> None:
        super().__init__(plan, enable_reuse=enable_reuse, state_snapshots=state_snapshots, events=events)
        self._padding: dict[int, int] = {}  # draft length -> persistent padding dummy id

    def free(self, rid: int) -> None:
        """Release every page of `rid` (cached content stays reusable until
        evicted) and forget the request; a padding dummy stops being reserved."""
        super().free(rid)
        for d, pad in list(self._padding.items()):
            if pad == rid:
                del self._padding[d]

    def resize_many(
        self, rids: Sequence[int], capacities: npt.ArrayLike, histories: npt.ArrayLike | None = None
    ) -> Resize:
        """`resize` for a batch of distinct requests in one call, atomic over the
        whole batch (falsy: nothing changed). The per-step decode path."""
        slots = self.requests.slots(rids)
        caps = batch_positions(capacities, slots.shape, "capacities")
        old = self.tables.hist[slots]
        hists = old if histories is None else batch_positions(histories, slots.shape, "histories")
        check_batch_shapes(rids, caps, hists, old)
        return self._resize_batch(rids, slots, caps, hists)

    def extend(self, rids: Sequence[int], num_tokens: int = 1) -> Resize:
        """One decode step for a batch: capacity and history of each request
        both advance by `num_tokens` (the tokens in flight become computed and
        as many new ones get slots). Atomic over the batch like `resize_many`."""
        num_tokens = as_position(num_tokens, "extend's num_tokens")
        slots = self.requests.slots(rids)
        t = self.tables
        return self._resize_batch(rids, slots, t.cap[slots] + num_tokens, t.hist[slots] + num_tokens)

    def _resize_batch(
        self,
        rids: Sequence[int],
        slots: npt.NDArray[np.intp],
        caps: npt.NDArray[np.int64],
        hists: npt.NDArray[np.int64],
    ) -> Resize:
        done = batch.move(self.tables, self.requests, rids, slots, caps, hists, self.max_capacity, self._keeps_stale)
        if done and self._lookups:
            self._count_lookups(rids)
        return done

    def take_events(self) -> list[CacheEvent]:
        """Stored/removed page events since the last call (oldest first), built
        now from the pools' records; clears them. Empty with `events=False`."""
        events = expand(self.events)
        self.events.clear()
        return events

    def can_resize(self, rid: int, capacity: int, history: int | None = None) -> Resize:
        """What `resize(rid, capacity, history)` would answer now; changes nothing."""
        req = self.requests.get(rid)
        limit = None if req.dummy else self.max_capacity
        cap, hist = checked_shape(rid, capacity, history, self.history(rid), limit)
        if req.hi >= 0:
            short = self.tables.plan_one(req, cap, hist)[1]
            return Resize(short) if short else RESIZED
        return self.tables.apply([req.slot], [cap], [hist], dry_run=True)

    def add_dummy_requests(self, batch_size: int, token_num: int, draft_len: int = 0, is_gen: bool = True) -> Dummies:
        """Register `batch_size` dummy requests of `token_num` tokens, all or
        nothing: a generation dummy gets capacity `token_num + draft_len + E`
        and history `token_num - 1` (rule 2; sliding groups then hold only the
        window), a context dummy capacity `token_num + E` and history 0. The
        result holds their (negative) ids, each released with `free`; falsy
        (nothing changed, the pages short named) when they do not fit."""
        warmup_mod.check_dummy_args(batch_size, token_num, draft_len)
        cap, hist = warmup_mod.dummy_shape(token_num, draft_len, self.limits.num_extra_kv_tokens, is_gen)
        registry = self.requests
        next_dummy, free_ids = registry.next_dummy, list(registry.free_dummy_ids)
        reqs = [self._new_request(registry.dummy_id(), dummy=True) for _ in range(batch_size)]
        slots = [r.slot for r in reqs]
        done = self.tables.apply(slots, [cap] * batch_size, [hist] * batch_size)
        if done:
            self.tables.cap_data[slots] = cap  # fresh slots: never mirrored
            self.tables.hist_data[slots] = hist
            return Dummies(tuple(r.rid for r in reqs))
        for r in reversed(reqs):  # slots go back in the order they came
            self.free(r.rid)
        registry.next_dummy, registry.free_dummy_ids = next_dummy, free_ids
        return Dummies(short=done.short)

    def max_generation_length(self, batch_size: int, draft_len: int = 0) -> int:
        """Largest token_num (history + current input) the longest row of a
        decode batch of `batch_size` can have, the other rows being minimal
        decodes, given the pages free now; page-exact, capped at
        `limits.max_seq_len`, 0 if nothing fits (see `plan.capture`)."""
        warmup_mod.check_dummy_args(batch_size, 1, draft_len)
        return warmup_mod.max_generation_length(self, batch_size, draft_len)

    def warmup(self, batch_sizes: Iterable[int] | None = None, draft_lens: Iterable[int] = (0,)) -> WarmupReport:
        """Dry-run CUDA-graph warmup for every (batch size, draft length)
        (default batch sizes: `limits.graph_batch_sizes`), then reserve one
        persistent padding dummy per draft length (see `padding_dummy`)."""
        sizes = tuple(self.limits.graph_batch_sizes if batch_sizes is None else batch_sizes)
        drafts = tuple(draft_lens)
        for b in sizes:
            for d in drafts:
                warmup_mod.check_dummy_args(b, 1, d)
        return warmup_mod.warmup(self, sizes, drafts)

    def reserve_padding_dummy(self, draft_len: int = 0) -> int | None:
        """The persistent padding dummy for `draft_len` (a minimal generation
        dummy kept allocated so padded decode batches always have pages),
        reserving it now if needed; None if the pages are not there."""
        if draft_len in self._padding:
            return self._padding[draft_len]
        dummy = self.add_dummy_requests(1, 1, draft_len)
        if not dummy:
            return None
        self._padding[draft_len] = dummy.ids[0]
        return dummy.ids[0]

    def padding_dummy(self, draft_len: int = 0) -> int | None:
        """Id of the reserved padding dummy for `draft_len`, or None."""
        return self._padding.get(draft_len)

    def _group(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise CacheUsageError(f"no group {name!r}; groups: {list(self._index)}") from None

    def pool_of(self, group: str) -> str:
        """The pool `group` takes pages from: the name of the shared pool it
        draws from with other groups (`PoolPlan.shared`), else its own name.
        Groups of one shared pool report that pool's free and total pages."""
        self._group(group)
        return self.plan.pool_of(group)

    def held_pages(self, group: str) -> int:
        """Pages the tables of `group` name now, summed over requests (a page
        shared by a prefix hit counts once per holder); no side effects."""
        gi = self._group(group)
        slots = [r.slot for r in self.requests]  # a freed slot keeps its old numbers until reused
        return int((self.tables.nblk[gi, slots] - self.tables.nstale[gi, slots]).sum())

    def check_integrity(self) -> None:
        """Raise `CacheIntegrityError` (naming page ids per group) unless every
        page is exactly one of free, owned (ref count = owners) or cached, and
        every table matches its request's shape. O(pages); for tests and debugging."""
        integrity.check_integrity(self.tables, self.requests)

    def stats(self) -> CacheStats:
        """Pages per group (total, free, used, cached, dummy, reserved) and
        cumulative reuse counters; groups that share a pool report its total,
        free, used and cached pages."""
        padding = set(self._padding.values())
        dummy_slots = [r.slot for r in self.requests if r.dummy and r.rid not in padding]
        pad_slots = [self.requests.get(r).slot for r in padding]
        groups = {}
        for gi, pool in enumerate(self.pools):
            live = self.tables.nblk[gi] - self.tables.nstale[gi]
            groups[pool.name] = GroupStats(
                total=pool.num_pages,
                free=pool.num_free,
                used=pool.num_pages - pool.num_free,
                cached=pool.num_cached,
                dummy=int(live[dummy_slots].sum()),
                reserved=int(live[pad_slots].sum()),
            )
        dummies = sum(1 for r in self.requests if r.dummy)
        return CacheStats(
            groups, self.reuse_queried_tokens, self.reuse_hit_tokens, len(self.requests) - dummies, dummies
        )

    # ------------------------------------------------------------------ tables and pools

    def block_table(self, rid: int, group: str) -> npt.NDArray[np.int32]:
        """Page ids of `rid` in `group`, one per block of positions (a copy);
        `STALE` (-1) marks blocks without a page. A state group has one entry."""
        gi = self._group(group)
        req = self.requests.get(rid)
        return self.tables.tables[gi][req.slot, : self.tables.counts(req)[0][gi]].copy()

    def block_tables(self, rids: Sequence[int], group: str) -> npt.NDArray[np.int32]:
        """Block tables of a batch as one 2-D array padded with `STALE`."""
        gi = self._group(group)
        slots = self.requests.slots(rids)
        t = self.tables
        width = max((t.counts(self.requests.get(r))[0][gi] for r in rids), default=0)
        return t.tables[gi][slots, :width]

    def free_pages(self, group: str) -> int:
        """Pages of `group` an allocation can take now (evictable cached ones included)."""
        return self.pools[self._group(group)].num_free

    def total_pages(self, group: str) -> int:
        return self.pools[self._group(group)].num_pages

    def live_pages(self, rid: int, group: str) -> int:
        """Pages `rid` holds in `group` now."""
        return self.tables.live(self._group(group), self.requests.get(rid))

    def iter_requests(self) -> Iterable[tuple[int, bool]]:
        """(rid, is_dummy) of every registered request."""
        return ((r.rid, r.dummy) for r in self.requests)
