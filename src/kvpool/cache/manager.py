"""`KVCacheManager`: the public face of the run-time page manager.

It keeps the requests (ids, prompt tokens and hashes for reuse, dummies and
padding reservations), the page pools and the event buffer; the shapes and
page tables themselves live in `SlotTables` (`cache/slots.py`), reuse rules in
`cache/reuse.py`, dummies and the capacity query in `cache/warmup.py`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvpool.cache import integrity, reuse
from kvpool.cache import warmup as warmup_mod
from kvpool.cache.events import CacheEvent, CacheStats, CacheUsageError, GroupStats
from kvpool.cache.pool import PagePool
from kvpool.cache.slots import STALE, SlotTables
from kvpool.cache.warmup import WarmupReport
from kvpool.plan.result import PoolPlan

__all__ = ["STALE", "KVCacheManager"]

EVENT_BUFFER = 1 << 16  # events kept until `take_events`; older ones are dropped


@dataclass(slots=True)
class _Request:
    rid: int
    slot: int
    seed: int = 0
    tokens: list[int] | None = None
    hashes: list[int] = field(default_factory=list)
    committed: int = 0  # leading whole pages already offered for reuse
    dummy: bool = False


class KVCacheManager:
    """Run-time pages of a `PoolPlan`: one pool per group, page tables per request.

    Not thread-safe. Request ids are ints chosen by the caller (use
    non-negative ones: dummies get negative ids from the manager).

    `state_snapshots=True` lets `commit` snapshot state groups (recurrent
    state) so that models with a state group can reuse prefixes at all; the
    engine must then copy each snapshot (see `CacheEvent.source_page`). Off by
    default: a hit on a snapshot the engine never filled would be silently wrong.
    """

    def __init__(self, plan: PoolPlan, *, enable_reuse: bool = True,
                 state_snapshots: bool = False) -> None:
        self.plan = plan
        self.spec = plan.spec
        self.limits = plan.limits
        self.enable_reuse = enable_reuse
        self.state_snapshots = state_snapshots
        self.tokens_per_block = self.spec.tokens_per_block
        self.groups = self.spec.groups
        self._index = {g.name: i for i, g in enumerate(self.groups)}
        # With reuse on, pages that leave a sliding window or a finished chunk
        # are stored before they are released (see `reuse.store_before_release`).
        self._keeps_stale = enable_reuse and any(
            g.kind in ("sliding", "chunked") for g in self.groups)
        self._events: deque[CacheEvent] = deque(maxlen=EVENT_BUFFER)
        self._pools = [PagePool(g.name, plan.pages(g.name), self._events) for g in self.groups]
        self._t = SlotTables(self.groups, self._pools, max(8, self.limits.max_batch_size + 8),
                             self.limits.max_seq_len + self.limits.headroom)
        self._requests: dict[int, _Request] = {}
        self._slot_of: dict[int, int] = {}
        self._padding: dict[int, int] = {}  # draft length -> persistent padding dummy id
        self._next_dummy = -1
        self._free_dummy_ids: list[int] = []  # heap of -id
        self.reuse_queried_tokens = 0
        self.reuse_hit_tokens = 0
        self._lookups: dict[int, tuple[int, int]] = {}  # rid -> (queried, hit) not yet counted

    @property
    def last_shortfall(self) -> dict[str, int]:
        """Pages missing per group at the last refused resize or dummy batch."""
        return self._t.last_shortfall

    # ------------------------------------------------------------------ requests

    def create(self, rid: int, tokens: Sequence[int] | None = None,
               salt: str | bytes | int | None = None) -> int:
        """Register request `rid` (capacity 0). With reuse on and `tokens` (the
        prompt) given, attach the longest cached prefix of whole pages (never
        the last prompt token, which must be computed for logits): capacity and
        history become the reused length, which is returned. The lookup counts
        in `stats()` once the request's first resize succeeds: a scheduler that
        creates, finds no room and frees again does not inflate the hit rate.
        Raises `CacheUsageError` for a duplicate id."""
        req = self._new_request(rid, dummy=False)
        if not (self.enable_reuse and tokens is not None):
            return 0
        req.tokens = list(tokens)
        req.seed = reuse.salt_seed(salt)
        hit = reuse.attach_prefix(self, req)
        self._lookups[rid] = (len(req.tokens), hit)
        return hit

    def _count_lookups(self, rids: Iterable[int]) -> None:
        """Count the pending prefix lookups of `rids` (their first resize succeeded)."""
        for rid in rids:
            if (lookup := self._lookups.pop(rid, None)) is not None:
                self.reuse_queried_tokens += lookup[0]
                self.reuse_hit_tokens += lookup[1]

    def free(self, rid: int) -> None:
        """Release every page of `rid` (cached content stays reusable until
        evicted) and forget the request; a padding dummy stops being reserved."""
        req = self._get(rid)
        self._t.release(req.slot)
        self._lookups.pop(rid, None)
        del self._requests[rid]
        del self._slot_of[rid]
        if req.dummy:
            heapq.heappush(self._free_dummy_ids, -rid)
        for d, pad in list(self._padding.items()):
            if pad == rid:
                del self._padding[d]

    def __contains__(self, rid: object) -> bool:
        return rid in self._requests

    def capacity(self, rid: int) -> int:
        return int(self._t.cap[self._get(rid).slot])

    def history(self, rid: int) -> int:
        return int(self._t.hist[self._get(rid).slot])

    @property
    def num_requests(self) -> int:
        """Registered requests, dummies included."""
        return len(self._requests)

    # ------------------------------------------------------------------ resizing

    def resize(self, rid: int, capacity: int, history: int | None = None) -> bool:
        """Give `rid` pages for `capacity` positions with `history` of them
        computed (None: unchanged); raising history releases pages that went
        stale. All groups or nothing: returns False and changes nothing when a
        group lacks pages (`last_shortfall` then says how many). Raises
        `CacheUsageError` if capacity < history or history decreases."""
        req = self._get(rid)
        slot, t = req.slot, self._t
        old = int(t.hist[slot])
        cap = int(capacity)
        hist = old if history is None else int(history)
        self._check_shape(rid, cap, hist, old)
        if (self._keeps_stale and req.tokens is not None and not req.dummy
                and hist >= int(t.stale_next[:, slot].min())):
            if not t.apply([slot], [cap], [hist], dry_run=True):
                return False
            reuse.store_before_release(self, req, hist)
        if not t.resize_one(slot, cap, hist):
            return False
        if self._lookups:
            self._count_lookups((rid,))
        return True

    @staticmethod
    def _check_shape(rid: int, cap: int, hist: int, old: int) -> None:
        if cap < hist or hist < old:
            raise CacheUsageError(
                f"request {rid}: need capacity >= history >= previous history, got capacity {cap}, "
                f"history {hist}, previous history {old}")

    def can_resize(self, rid: int, capacity: int, history: int | None = None) -> bool:
        """Whether `resize(rid, capacity, history)` would succeed now; changes
        nothing (but `last_shortfall` on False)."""
        slot = self._get(rid).slot
        old = int(self._t.hist[slot])
        hist = old if history is None else int(history)
        self._check_shape(rid, int(capacity), hist, old)
        return self._t.apply([slot], [int(capacity)], [hist], dry_run=True)

    def resize_many(self, rids: Sequence[int], capacities: npt.ArrayLike,
                    histories: npt.ArrayLike | None = None) -> bool:
        """`resize` for a batch of distinct requests in one call, atomic over the
        whole batch (False: nothing changed). The per-step decode path."""
        slots = self._slots(rids)
        caps = np.broadcast_to(np.asarray(capacities, np.int64), slots.shape)
        old = self._t.hist[slots]
        hists = old if histories is None else np.broadcast_to(np.asarray(histories, np.int64),
                                                              slots.shape)
        if (caps < hists).any() or (hists < old).any():
            bad = int(np.flatnonzero((caps < hists) | (hists < old))[0])
            raise CacheUsageError(
                f"request {rids[bad]}: need capacity >= history >= previous history, got capacity "
                f"{int(caps[bad])}, history {int(hists[bad])}, previous history {int(old[bad])}")
        return self._resize_batch(rids, slots, caps, hists)

    def extend(self, rids: Sequence[int], num_tokens: int = 1) -> bool:
        """One decode step for a batch: capacity and history of each request
        both advance by `num_tokens` (the tokens in flight become computed and
        as many new ones get slots). Atomic over the batch like `resize_many`."""
        if num_tokens < 0:
            raise CacheUsageError(f"extend needs num_tokens >= 0, got {num_tokens}")
        slots = self._slots(rids)
        t = self._t
        return self._resize_batch(rids, slots, t.cap[slots] + num_tokens, t.hist[slots] + num_tokens)

    def _resize_batch(self, rids: Sequence[int], slots: npt.NDArray[np.intp],
                      caps: npt.NDArray[np.int64], hists: npt.NDArray[np.int64]) -> bool:
        t = self._t
        if self._keeps_stale:
            going = [(self._requests[rids[j]], int(hists[j])) for j in
                     np.flatnonzero(hists >= t.stale_next[:, slots].min(axis=0)).tolist()]
            going = [(req, h) for req, h in going if req.tokens is not None and not req.dummy]
            if going:
                if not t.resize_batch(slots, caps, hists, dry_run=True):
                    return False
                for req, h in going:
                    reuse.store_before_release(self, req, h)
        if not t.resize_batch(slots, caps, hists):
            return False
        if self._lookups:
            self._count_lookups(rids)
        return True

    # ------------------------------------------------------------------ dummies and warmup

    def add_dummy_requests(self, batch_size: int, token_num: int, draft_len: int = 0,
                           is_gen: bool = True) -> list[int] | None:
        """Register `batch_size` dummy requests of `token_num` tokens, all or
        nothing: a generation dummy gets capacity `token_num + draft_len + E`
        and history `token_num - 1` (rule 2; sliding groups then hold only the
        window), a context dummy capacity `token_num + E` and history 0. Returns
        their (negative) ids, released with `free`, or None (nothing changed)."""
        warmup_mod.check_dummy_args(batch_size, token_num, draft_len)
        cap, hist = warmup_mod.dummy_shape(token_num, draft_len, self.limits.num_extra_kv_tokens,
                                           is_gen)
        next_dummy, free_ids = self._next_dummy, list(self._free_dummy_ids)
        reqs = [self._new_request(self._dummy_id(), dummy=True) for _ in range(batch_size)]
        slots = [r.slot for r in reqs]
        if self._t.apply(slots, [cap] * batch_size, [hist] * batch_size):
            self._t.cap[slots] = cap
            self._t.hist[slots] = hist
            return [r.rid for r in reqs]
        for r in reversed(reqs):  # slots go back in the order they came
            self.free(r.rid)
        self._next_dummy, self._free_dummy_ids = next_dummy, free_ids
        return None

    def max_generation_length(self, batch_size: int, draft_len: int = 0) -> int:
        """Largest token_num (history + current input) the longest row of a
        decode batch of `batch_size` can have, the other rows being minimal
        decodes, given the pages free now; page-exact, capped at
        `limits.max_seq_len`, 0 if nothing fits (see `cache.warmup`)."""
        return warmup_mod.max_generation_length(self, batch_size, draft_len)

    def warmup(self, batch_sizes: Iterable[int] | None = None,
               draft_lens: Iterable[int] = (0,)) -> WarmupReport:
        """Dry-run CUDA-graph warmup for every (batch size, draft length)
        (default batch sizes: `limits.graph_batch_sizes`), then reserve one
        persistent padding dummy per draft length (see `padding_dummy`)."""
        sizes = self.limits.graph_batch_sizes if batch_sizes is None else batch_sizes
        return warmup_mod.warmup(self, sizes, draft_lens)

    def reserve_padding_dummy(self, draft_len: int = 0) -> int | None:
        """The persistent padding dummy for `draft_len` (a minimal generation
        dummy kept allocated so padded decode batches always have pages),
        reserving it now if needed; None if the pages are not there."""
        if draft_len in self._padding:
            return self._padding[draft_len]
        ids = self.add_dummy_requests(1, 1, draft_len)
        if ids is None:
            return None
        self._padding[draft_len] = ids[0]
        return ids[0]

    def padding_dummy(self, draft_len: int = 0) -> int | None:
        """Id of the reserved padding dummy for `draft_len`, or None."""
        return self._padding.get(draft_len)

    def _dummy_id(self) -> int:
        while self._free_dummy_ids:  # reuse freed dummy ids, closest to -1 first
            rid = -heapq.heappop(self._free_dummy_ids)
            if rid not in self._requests:
                return rid
        while self._next_dummy in self._requests:
            self._next_dummy -= 1
        rid = self._next_dummy
        self._next_dummy -= 1
        return rid

    # ------------------------------------------------------------------ reuse

    def commit(self, rid: int, num_tokens: int, tokens: Sequence[int] | None = None) -> int:
        """Offer the whole pages among the first `num_tokens` positions of `rid`
        for reuse (chained hashes of token ids and the salt; records `stored`
        events). `tokens` appends token ids the manager has not seen yet (the
        prompt came with `create`; pass generated tokens here). Commit only
        verified tokens, never drafts: `num_tokens` may not exceed history.
        Returns the tokens now reusable; a no-op (0) with reuse off or for dummies."""
        req = self._get(rid)
        if not self.enable_reuse or req.dummy:
            return 0
        return reuse.commit(self, req, int(num_tokens), tokens)

    def check_integrity(self) -> None:
        """Raise `CacheIntegrityError` (naming page ids per group) unless every
        page is exactly one of free, owned (ref count = owners) or cached, and
        every table matches its request's shape. O(pages); for tests and debugging."""
        integrity.check_integrity(self)

    def take_events(self) -> list[CacheEvent]:
        """Stored/removed page events since the last call (oldest first); clears them."""
        events = list(self._events)
        self._events.clear()
        return events

    # ------------------------------------------------------------------ tables and pools

    def block_table(self, rid: int, group: str) -> npt.NDArray[np.int32]:
        """Page ids of `rid` in `group`, one per block of positions (a copy);
        `STALE` (-1) marks blocks without a page. A state group has one entry."""
        gi = self._group(group)
        slot = self._get(rid).slot
        return self._t.tables[gi][slot, :int(self._t.nblk[gi, slot])].copy()

    def block_tables(self, rids: Sequence[int], group: str) -> npt.NDArray[np.int32]:
        """Block tables of a batch as one 2-D array padded with `STALE`."""
        gi = self._group(group)
        slots = self._slots(rids)
        width = int(self._t.nblk[gi, slots].max()) if len(slots) else 0
        return self._t.tables[gi][slots, :width]

    def free_pages(self, group: str) -> int:
        """Pages of `group` an allocation can take now (evictable cached ones included)."""
        return self._pools[self._group(group)].num_free

    def total_pages(self, group: str) -> int:
        return self._pools[self._group(group)].num_pages

    def live_pages(self, rid: int, group: str) -> int:
        """Pages `rid` holds in `group` now."""
        return self._t.live(self._group(group), self._get(rid).slot)

    def stats(self) -> CacheStats:
        """Pages per group (total, free, used, cached, dummy, reserved) and
        cumulative reuse counters."""
        padding = set(self._padding.values())
        dummy_slots = [r.slot for r in self._requests.values() if r.dummy and r.rid not in padding]
        pad_slots = [self._requests[r].slot for r in padding]
        groups = {}
        for gi, pool in enumerate(self._pools):
            live = self._t.nblk[gi] - self._t.nstale[gi]
            groups[pool.name] = GroupStats(
                total=pool.num_pages, free=pool.num_free, used=pool.num_pages - pool.num_free,
                cached=pool.num_cached, dummy=int(live[dummy_slots].sum()),
                reserved=int(live[pad_slots].sum()))
        dummies = sum(1 for r in self._requests.values() if r.dummy)
        return CacheStats(groups, self.reuse_queried_tokens, self.reuse_hit_tokens,
                          len(self._requests) - dummies, dummies)

    # ------------------------------------------------------------------ internals

    def _get(self, rid: int) -> _Request:
        try:
            return self._requests[rid]
        except KeyError:
            raise CacheUsageError(f"unknown request id {rid!r}") from None

    def _group(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise CacheUsageError(f"no group {name!r}; groups: {list(self._index)}") from None

    def _slots(self, rids: Sequence[int]) -> npt.NDArray[np.intp]:
        slot_of = self._slot_of
        try:
            slots = np.fromiter(map(slot_of.__getitem__, rids), np.intp, len(rids))
        except KeyError as e:
            raise CacheUsageError(f"unknown request id {e.args[0]!r}") from None
        if len(set(slots.tolist())) != len(slots):
            raise CacheUsageError("a batch names the same request twice")
        return slots

    def _new_request(self, rid: int, *, dummy: bool) -> _Request:
        if rid in self._requests:
            raise CacheUsageError(f"request id {rid!r} already exists")
        slot = self._t.acquire()
        req = _Request(rid, slot, dummy=dummy)
        self._requests[rid] = req
        self._slot_of[rid] = slot
        return req

    def iter_requests(self) -> Iterable[tuple[int, bool]]:
        """(rid, is_dummy) of every registered request."""
        return ((r.rid, r.dummy) for r in self._requests.values())
