"""`KVCacheManager`: per-request page tables over one page pool per group.

A request is a (capacity, history) pair (DESIGN vocabulary). Its page table in
a group has one entry per page-sized block of positions; blocks that fell out
of a sliding window or a finished chunk hold `STALE`. Every page count comes
from `kvpool.spec.pages`: a resize asks `pages_needed` and `stale_pages` for
the target and moves the table there, all groups or none (rule 6).

Per-request numbers live in NumPy arrays indexed by a slot id, so the batched
decode path (`resize_many`, `extend`) finds with a few vector comparisons the
requests whose step crosses a page boundary (capacity past the last page,
capacity below it, or history reaching the next stale page) and runs the same
scalar planner only on those.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvpool.cache import integrity, reuse
from kvpool.cache import warmup as warmup_mod
from kvpool.cache.events import CacheEvent, CacheStats, CacheUsageError, GroupStats
from kvpool.cache.pool import PagePool
from kvpool.cache.warmup import WarmupReport
from kvpool.plan.result import PoolPlan
from kvpool.spec.pages import pages_needed, stale_pages

STALE = -1  # block-table entry of a block that has no page (stale or never needed)
_BIG = 1 << 62  # "never": threshold of groups that never go stale
EVENT_BUFFER = 1 << 16  # events kept until `take_events`; older ones are dropped

IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class _Request:
    rid: int
    slot: int
    seed: int = 0
    tokens: list[int] | None = None
    hashes: list[int] = field(default_factory=list)
    committed: int = 0  # leading whole pages already offered for reuse
    dummy: bool = False


@dataclass(slots=True)
class _Change:
    """How one request's table in one group moves (planned, not yet applied)."""

    group: int
    slot: int
    nblk: int
    nstale: int
    first_new: int
    new: int
    release: list[int]
    old_nstale: int
    old_nblk: int
    hist: int


class KVCacheManager:
    """Run-time pages of a `PoolPlan`: one pool per group, page tables per request.

    Not thread-safe. Request ids are ints chosen by the caller (use
    non-negative ones: dummies get negative ids from the manager).
    """

    def __init__(self, plan: PoolPlan, *, enable_reuse: bool = True) -> None:
        self.plan = plan
        self.spec = plan.spec
        self.limits = plan.limits
        self.enable_reuse = enable_reuse
        self.tokens_per_block = self.spec.tokens_per_block
        self.groups = self.spec.groups
        self._index = {g.name: i for i, g in enumerate(self.groups)}
        self._events: deque[CacheEvent] = deque(maxlen=EVENT_BUFFER)
        self._pools = [PagePool(g.name, plan.pages(g.name), self._events) for g in self.groups]
        self._is_state = [g.kind == "state" for g in self.groups]
        self._never_stale = [stale_pages(g, _BIG) == 0 for g in self.groups]
        n_groups, slots = len(self.groups), max(8, self.limits.max_batch_size + 8)
        self._cap: IntArray = np.zeros(slots, np.int64)
        self._hist: IntArray = np.zeros(slots, np.int64)
        self._nblk: IntArray = np.zeros((n_groups, slots), np.int64)
        self._nstale: IntArray = np.zeros((n_groups, slots), np.int64)
        self._cap_hi: IntArray = np.zeros((n_groups, slots), np.int64)
        self._cap_lo: IntArray = np.full((n_groups, slots), -1, np.int64)
        self._stale_next: IntArray = np.full((n_groups, slots), _BIG, np.int64)
        longest = self.limits.max_seq_len + self.limits.headroom
        self._tables = [
            np.full((slots, pages_needed(g, longest) if self._is_state[i] else
                     pages_needed(g, longest) + stale_pages(g, 0) + 1), STALE, np.int32)
            for i, g in enumerate(self.groups)
        ]
        self._free_slots = list(range(slots - 1, -1, -1))
        self._requests: dict[int, _Request] = {}
        self._slot_of: dict[int, int] = {}
        self._padding: dict[int, int] = {}  # draft length -> persistent padding dummy id
        self._next_dummy = -1
        self.reuse_queried_tokens = 0
        self.reuse_hit_tokens = 0
        self.last_shortfall: dict[str, int] = {}  # pages missing per group at the last refusal

    # ------------------------------------------------------------------ requests

    def create(self, rid: int, tokens: Sequence[int] | None = None,
               salt: str | bytes | int | None = None) -> int:
        """Register request `rid` (capacity 0). With reuse on and `tokens` (the
        prompt) given, attach the longest cached prefix of whole pages (never
        the last prompt token, which must be computed for logits): capacity and
        history become the reused length, which is returned. Raises
        `CacheUsageError` for a duplicate id."""
        req = self._new_request(rid, dummy=False)
        if not (self.enable_reuse and tokens is not None):
            return 0
        req.tokens = list(tokens)
        req.seed = reuse.salt_seed(salt)
        self.reuse_queried_tokens += len(req.tokens)
        hit = reuse.attach_prefix(self, req)
        self.reuse_hit_tokens += hit
        return hit

    def free(self, rid: int) -> None:
        """Release every page of `rid` (cached content stays reusable until
        evicted) and forget the request; a padding dummy stops being reserved."""
        req = self._get(rid)
        slot = req.slot
        for gi, pool in enumerate(self._pools):
            nblk, nstale = int(self._nblk[gi, slot]), int(self._nstale[gi, slot])
            if nblk:
                row = self._tables[gi][slot]
                pages = row[nstale:nblk].tolist()
                pages.reverse()  # the tail is evicted first, the shared prefix last
                pool.release(pages)
                row[:nblk] = STALE
        self._reset_slot(slot)
        del self._requests[rid]
        del self._slot_of[rid]
        self._free_slots.append(slot)
        for d, pad in list(self._padding.items()):
            if pad == rid:
                del self._padding[d]

    def __contains__(self, rid: object) -> bool:
        return rid in self._requests

    def capacity(self, rid: int) -> int:
        return int(self._cap[self._get(rid).slot])

    def history(self, rid: int) -> int:
        return int(self._hist[self._get(rid).slot])

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
        slot = self._get(rid).slot
        old = int(self._hist[slot])
        cap = int(capacity)
        hist = old if history is None else int(history)
        if cap < hist or hist < old:
            raise CacheUsageError(
                f"request {rid}: need capacity >= history >= previous history, got capacity {cap}, "
                f"history {hist}, previous history {old}")
        if not self._apply([slot], [cap], [hist]):
            return False
        self._cap[slot] = cap
        self._hist[slot] = hist
        return True

    def resize_many(self, rids: Sequence[int], capacities: npt.ArrayLike,
                    histories: npt.ArrayLike | None = None) -> bool:
        """`resize` for a batch of distinct requests in one call, atomic over the
        whole batch (False: nothing changed). The per-step decode path."""
        slots = self._slots(rids)
        caps = np.broadcast_to(np.asarray(capacities, np.int64), slots.shape)
        old = self._hist[slots]
        hists = old if histories is None else np.broadcast_to(np.asarray(histories, np.int64),
                                                              slots.shape)
        if (caps < hists).any() or (hists < old).any():
            bad = int(np.flatnonzero((caps < hists) | (hists < old))[0])
            raise CacheUsageError(
                f"request {rids[bad]}: need capacity >= history >= previous history, got capacity "
                f"{int(caps[bad])}, history {int(hists[bad])}, previous history {int(old[bad])}")
        return self._resize_slots(slots, caps, hists)

    def extend(self, rids: Sequence[int], num_tokens: int = 1) -> bool:
        """One decode step for a batch: capacity and history of each request
        both advance by `num_tokens` (the tokens in flight become computed and
        as many new ones get slots). Atomic over the batch like `resize_many`."""
        slots = self._slots(rids)
        return self._resize_slots(slots, self._cap[slots] + num_tokens, self._hist[slots] + num_tokens)

    def _resize_slots(self, slots: npt.NDArray[np.intp], caps: IntArray, hists: IntArray) -> bool:
        c, h = caps[None, :], hists[None, :]
        crossing = ((c > self._cap_hi[:, slots]) | (c <= self._cap_lo[:, slots])
                    | (h >= self._stale_next[:, slots])).any(axis=0)
        idx = np.flatnonzero(crossing)
        if idx.size and not self._apply(slots[idx].tolist(), caps[idx].tolist(), hists[idx].tolist()):
            return False
        self._cap[slots] = caps
        self._hist[slots] = hists
        return True

    def _plan(self, gi: int, slot: int, cap: int, hist: int) -> _Change | None:
        g = self.groups[gi]
        nblk, nstale = int(self._nblk[gi, slot]), int(self._nstale[gi, slot])
        stale = stale_pages(g, hist)
        total = pages_needed(g, cap, hist) + stale
        if total == nblk and stale == nstale:
            return None
        row = self._tables[gi][slot]
        release = row[nstale:min(stale, nblk)].tolist() if stale > nstale else []
        if total < nblk:
            release += row[total:nblk].tolist()
        first_new = max(nblk, stale)
        return _Change(gi, slot, total, stale, first_new, max(0, total - first_new), release,
                       nstale, nblk, hist)

    def _apply(self, slots: Sequence[int], caps: Sequence[int], hists: Sequence[int]) -> bool:
        """Plan every (slot, capacity, history) in every group; if all groups
        have the pages, apply (releases first, then allocations); else change
        nothing and return False."""
        changes: list[_Change] = []
        need = [0] * len(self.groups)
        released: list[list[int]] | None = None
        for slot, cap, hist in zip(slots, caps, hists, strict=True):
            for gi in range(len(self.groups)):
                ch = self._plan(gi, slot, cap, hist)
                if ch is not None:
                    changes.append(ch)
                    need[gi] += ch.new
                    if ch.release:
                        if released is None:
                            released = [[] for _ in self.groups]
                        released[gi] += ch.release
        short = {}
        for gi, pool in enumerate(self._pools):
            if need[gi] and need[gi] > pool.num_free:
                freed = self._freed(pool, released[gi]) if released else 0
                if need[gi] > pool.num_free + freed:
                    short[pool.name] = need[gi] - pool.num_free - freed
        if short:
            self.last_shortfall = short
            return False
        for ch in changes:
            if ch.release:
                row = self._tables[ch.group][ch.slot]
                if ch.nstale > ch.old_nstale:
                    row[ch.old_nstale:min(ch.nstale, ch.old_nblk)] = STALE
                if ch.nblk < ch.old_nblk:
                    row[ch.nblk:ch.old_nblk] = STALE
                self._pools[ch.group].release(ch.release)
        for ch in changes:
            gi, slot = ch.group, ch.slot
            if ch.new:
                table = self._tables[gi]
                if ch.nblk > table.shape[1]:
                    table = self._widen(gi, ch.nblk)
                table[slot, ch.first_new:ch.nblk] = self._pools[gi].take(ch.new)
            self._set_blocks(gi, slot, ch.nblk, ch.nstale)
            if ch.nstale != ch.old_nstale:
                self._stale_next[gi, slot] = self._next_stale(gi, ch.hist)
        return True

    @staticmethod
    def _freed(pool: PagePool, pages: list[int]) -> int:
        """How many of `pages` (one entry per owner released) end unowned."""
        count: dict[int, int] = {}
        for p in pages:
            count[p] = count.get(p, 0) + 1
        return sum(1 for p, c in count.items() if pool.ref[p] == c)

    def _set_blocks(self, gi: int, slot: int, nblk: int, nstale: int) -> None:
        """Record a table's block count and the capacities that keep it."""
        self._nblk[gi, slot] = nblk
        self._nstale[gi, slot] = nstale
        if self._is_state[gi]:
            self._cap_hi[gi, slot] = _BIG if nblk else 0
            self._cap_lo[gi, slot] = 0 if nblk else -1
        else:  # block j covers positions [j*tpb, (j+1)*tpb)
            self._cap_hi[gi, slot] = nblk * self.tokens_per_block
            self._cap_lo[gi, slot] = (nblk - 1) * self.tokens_per_block if nblk else -1

    def _next_stale(self, gi: int, hist: int) -> int:
        """Smallest history above `hist` at which `stale_pages` grows; searched
        with `stale_pages` itself (galloping, then bisection) so there is no
        second copy of the arithmetic."""
        if self._never_stale[gi]:
            return _BIG
        g = self.groups[gi]
        now = stale_pages(g, hist)
        lo, step = hist, self.tokens_per_block
        while stale_pages(g, hist + step) == now:
            lo, step = hist + step, step * 2
        hi = hist + step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if stale_pages(g, mid) == now:
                lo = mid
            else:
                hi = mid
        return hi

    # ------------------------------------------------------------------ dummies and warmup

    def add_dummy_requests(self, batch_size: int, token_num: int, draft_len: int = 0,
                           is_gen: bool = True) -> list[int] | None:
        """Register `batch_size` dummy requests of `token_num` tokens, all or
        nothing: a generation dummy gets capacity `token_num + draft_len + E`
        and history `token_num - 1` (rule 2; sliding groups then hold only the
        window), a context dummy capacity `token_num + E` and history 0. Returns
        their (negative) ids, released with `free`, or None (nothing changed)."""
        warmup_mod._check_counts(batch_size, token_num, draft_len)
        cap, hist = warmup_mod.dummy_shape(token_num, draft_len, self.limits.num_extra_kv_tokens,
                                           is_gen)
        next_dummy = self._next_dummy
        reqs = [self._new_request(self._dummy_id(), dummy=True) for _ in range(batch_size)]
        slots = [r.slot for r in reqs]
        if self._apply(slots, [cap] * batch_size, [hist] * batch_size):
            self._cap[slots] = cap
            self._hist[slots] = hist
            return [r.rid for r in reqs]
        for r in reqs:
            self.free(r.rid)
        self._next_dummy = next_dummy
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
        return self._tables[gi][slot, :int(self._nblk[gi, slot])].copy()

    def block_tables(self, rids: Sequence[int], group: str) -> npt.NDArray[np.int32]:
        """Block tables of a batch as one 2-D array padded with `STALE`."""
        gi = self._group(group)
        slots = self._slots(rids)
        width = int(self._nblk[gi, slots].max()) if len(slots) else 0
        return self._tables[gi][slots, :width]

    def free_pages(self, group: str) -> int:
        """Pages of `group` an allocation can take now (evictable cached ones included)."""
        return self._pools[self._group(group)].num_free

    def total_pages(self, group: str) -> int:
        return self._pools[self._group(group)].num_pages

    def live_pages(self, rid: int, group: str) -> int:
        """Pages `rid` holds in `group` now."""
        gi, slot = self._group(group), self._get(rid).slot
        return int(self._nblk[gi, slot] - self._nstale[gi, slot])

    def stats(self) -> CacheStats:
        """Pages per group (total, free, used, cached, dummy, reserved) and
        cumulative reuse counters."""
        padding = set(self._padding.values())
        dummy_slots = [r.slot for r in self._requests.values() if r.dummy and r.rid not in padding]
        pad_slots = [self._requests[r].slot for r in padding]
        groups = {}
        for gi, pool in enumerate(self._pools):
            live = self._nblk[gi] - self._nstale[gi]
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
        if not self._free_slots:
            self._grow()
        slot = self._free_slots.pop()
        req = _Request(rid, slot, dummy=dummy)
        self._requests[rid] = req
        self._slot_of[rid] = slot
        for gi in range(len(self.groups)):
            self._stale_next[gi, slot] = self._next_stale(gi, 0)
        return req

    def _reset_slot(self, slot: int) -> None:
        self._cap[slot] = self._hist[slot] = 0
        self._nblk[:, slot] = 0
        self._nstale[:, slot] = 0
        self._cap_hi[:, slot] = 0
        self._cap_lo[:, slot] = -1
        self._stale_next[:, slot] = _BIG

    def _grow(self) -> None:
        """Double the slot arrays (more live requests than planned for)."""
        old = self._cap.shape[0]

        def more(a: IntArray, fill: int) -> IntArray:
            extra = np.full(a.shape[:-1] + (old,), fill, a.dtype)
            return np.concatenate([a, extra], axis=-1)

        self._cap, self._hist = more(self._cap, 0), more(self._hist, 0)
        self._nblk, self._nstale = more(self._nblk, 0), more(self._nstale, 0)
        self._cap_hi, self._cap_lo = more(self._cap_hi, 0), more(self._cap_lo, -1)
        self._stale_next = more(self._stale_next, _BIG)
        self._tables = [np.concatenate([t, np.full_like(t, STALE)]) for t in self._tables]
        self._free_slots = list(range(2 * old - 1, old - 1, -1)) + self._free_slots

    def _widen(self, gi: int, width: int) -> npt.NDArray[np.int32]:
        t = self._tables[gi]
        wide = np.full((t.shape[0], max(width, 2 * t.shape[1])), STALE, np.int32)
        wide[:, :t.shape[1]] = t
        self._tables[gi] = wide
        return wide

    def iter_requests(self) -> Iterable[tuple[int, bool]]:
        """(rid, is_dummy) of every registered request."""
        return ((r.rid, r.dummy) for r in self._requests.values())
