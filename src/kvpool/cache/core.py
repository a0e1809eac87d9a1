"""`KVCacheCore`: requests and their pages, the part of the manager every
allocation goes through.

It keeps the request records (`cache/request.py`), one page pool per group and
the slot tables (`cache/slots.py`); reuse rules live in `cache/reuse.py`.
`KVCacheManager` (`cache/manager.py`) adds the batched calls, dummies, the
capacity query, warmup, events and statistics on top.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from kvpool.cache import reuse
from kvpool.cache.checks import (
    INT64_MAX,
    as_position,
    check_few_tokens,
    check_rid,
    check_tokens,
    checked_shape,
)
from kvpool.cache.crossing import advance_across, cross
from kvpool.cache.events import CacheUsageError, EventRecord
from kvpool.cache.prompt_memo import PromptMemo
from kvpool.cache.request import Request, Requests
from kvpool.cache.results import RESIZED, Resize
from kvpool.cache.shared_pool import build_pools
from kvpool.cache.slots import SlotTables
from kvpool.plan.result import PoolPlan
from kvpool.spec.kinds import NEVER

EVENT_BUFFER = 1 << 16  # event records (runs of pages) kept until `take_events`; older ones are dropped


class KVCacheCore:
    """Run-time pages of a `PoolPlan`: one pool per group, page tables per request.

    Not thread-safe. Request ids are ints chosen by the caller (use
    non-negative ones: negative ids are the dummies').

    Every method that allocates returns a `Resize` that is truthy on success
    and, on refusal, names the pages short per group and has changed nothing
    (`cache.results`). `tables`, `pools`, `requests` and `events` (records
    of runs of pages; `take_events` builds the `CacheEvent`s) are the
    bookkeeping, public for the integrity checker, tools and tests: read them,
    never write them. `events=False` records no events at all.

    `state_snapshots=True` lets `commit` snapshot state groups (recurrent
    state) so that models with a state group can reuse prefixes at all; the
    engine must then copy each snapshot (see `CacheEvent.source_page`). Off by
    default: a hit on a snapshot the engine never filled would be silently wrong.
    """

    def __init__(
        self, plan: PoolPlan, *, enable_reuse: bool = True, state_snapshots: bool = False, events: bool = True
    ) -> None:
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
        self.events: deque[EventRecord] = deque(maxlen=EVENT_BUFFER)
        self.pools = build_pools(plan, self.events)  # one per group; views where the plan shares a pool
        for pool in self.pools:
            pool.record_events = events
        self.tables = SlotTables(
            self.groups,
            self.pools,
            max(8, self.limits.max_batch_size + 8),
            self.limits.max_seq_len + self.limits.headroom,
        )
        self.max_capacity = self.limits.max_seq_len + self.limits.headroom  # what the pools were sized for
        self._keeps_stale = enable_reuse and not all(self.tables.never_stale)
        # groups that share a pool are counted together: the planner's case, not a crossing's
        self._crosses = not self.tables.shared
        self._pages_only = self.tables.paged_only  # no state group to snapshot at a commit
        self._moves_across = self._crosses and self._pages_only  # `advance_across` (a crossing and a commit)
        self.requests = Requests()
        self._by_id = self.requests.by_id  # the fast paths' lookup (no method call)
        self.reuse_queried_tokens = 0
        self.reuse_hit_tokens = 0
        self._lookups: dict[int, tuple[int, int]] = {}  # rid -> (queried, hit) not yet counted
        self._prompts = PromptMemo()  # the last prompt's digests, for the next that shares its start

    # ------------------------------------------------------------------ requests

    def create(self, rid: int, tokens: Sequence[int] | None = None, salt: str | bytes | int | None = None) -> int:
        """Register request `rid` (capacity 0). With reuse on and `tokens` (the
        prompt) given, attach the longest cached prefix of whole pages (never
        the last prompt token, which must be computed for logits): capacity and
        history become the reused length, which is returned. The lookup counts
        in `stats()` once the request's first resize succeeds: a scheduler that
        creates, finds no room and frees again does not inflate the hit rate.
        Raises `CacheUsageError` for a duplicate or non-int id, tokens that
        are not token ids, or a salt of another type (nothing registered then)."""
        check_rid(rid)
        ids = check_tokens(tokens, f"request {rid}: tokens") if self.enable_reuse and tokens is not None else None
        seed = reuse.salt_seed(salt) if ids is not None else 0
        req = self._new_request(rid, dummy=False)
        if ids is None:
            return 0
        req.tokens, req.seed = ids, seed
        hit = reuse.attach_prefix(self.tables, req, self._prompts)
        self._lookups[rid] = (len(ids), hit)
        req.nxt = -1  # no fast path until the first resize counted the lookup
        return hit

    def _count_lookups(self, rids: Iterable[int]) -> None:
        """Count the pending prefix lookups of `rids` (their first resize succeeded)."""
        for rid in rids:
            if (lookup := self._lookups.pop(rid, None)) is not None:
                self.reuse_queried_tokens += lookup[0]
                self.reuse_hit_tokens += lookup[1]

    def free(self, rid: int) -> None:
        """Release every page of `rid` (cached content stays reusable until
        evicted) and forget the request."""
        req = self.requests.get(rid)
        self.tables.release(req)
        self._lookups.pop(rid, None)
        self.requests.remove(rid)

    def __contains__(self, rid: object) -> bool:
        return rid in self.requests

    def capacity(self, rid: int) -> int:
        return self.tables.shape(self.requests.get(rid))[0]

    def history(self, rid: int) -> int:
        return self.tables.shape(self.requests.get(rid))[1]

    @property
    def num_requests(self) -> int:
        """Registered requests, dummies included."""
        return len(self.requests)

    # ------------------------------------------------------------------ resizing

    def resize(self, rid: int, capacity: int, history: int | None = None) -> Resize:
        """Give `rid` pages for `capacity` positions with `history` of them
        computed (None: unchanged); raising history releases pages that went
        stale. All groups or nothing: a falsy result, naming the pages short
        per group, changed nothing. Raises `CacheUsageError` if capacity <
        history or history decreases."""
        # Fast path: the request's mirror (`cache/shapes.py`) says no page moves in any group (and the
        # capacity stays within max_capacity); plain ints only. Next, a one-page crossing
        # (`cache/crossing.py`). Anything else takes the full path below.
        req = self._by_id.get(rid)
        if req is not None and type(capacity) is int:
            hist = req.hist if history is None else history
            if type(hist) is int and req.lo < capacity and req.hist <= hist <= capacity:
                if capacity <= req.hi and hist < req.nxt:
                    req.cap = capacity
                    req.hist = hist
                    return RESIZED
                if self._crosses and cross(self.tables, req, capacity, hist, self._keeps_stale):
                    return RESIZED
        if req is None:
            req = self.requests.get(rid)  # raises
        t = self.tables
        if req.hi < 0:  # a batch move or a reader of the arrays took the mirror back
            t.mirror(req, NEVER if req.dummy else self.max_capacity)
            if rid in self._lookups:
                req.nxt = -1
        cap, hist = checked_shape(rid, capacity, history, req.hist, None if req.dummy else self.max_capacity)
        plans, short = t.plan_one(req, cap, hist)
        if short:
            return Resize(short)
        if self._keeps_stale and req.tokens is not None and not req.dummy and hist >= min(req.nxts):
            reuse.store_before_release(t, req, hist)  # hashes only: the plan stays valid
        t.apply_one(req, plans, cap, hist)
        if self._lookups and rid in self._lookups:
            self._count_lookups((rid,))
            t.rebound(req)  # the fast path is open from now on
        return RESIZED

    def commit(self, rid: int, num_tokens: int, tokens: Sequence[int] | None = None) -> int:
        """Offer the whole pages among the first `num_tokens` positions of `rid`
        for reuse (chained hashes of token ids and the salt; records `stored`
        events). `tokens` appends token ids the manager has not seen yet (the
        prompt came with `create`; pass generated tokens here). Commit only
        verified tokens, never drafts: `num_tokens` may not exceed history.
        Returns the tokens now reusable; a no-op (0) with reuse off or for dummies."""
        # Fast path (a decode step): a mirrored request with known tokens (so reuse is on and it is
        # no dummy), at most one new plain token, and no page completes, or exactly one does and no
        # state group would want a snapshot of it. The common case (one token, no page) is tested first.
        req = self._by_id.get(rid)
        if (
            req is not None
            and type(num_tokens) is int
            and (known := req.tokens) is not None
            and req.hi >= 0
            and 0 <= num_tokens <= req.hist
        ):
            tpb = self.tokens_per_block
            done = req.committed * tpb
            if type(tokens) is tuple:
                if len(tokens) == 1 and num_tokens <= req.base + len(known) + 1:
                    x = tokens[0]
                    if type(x) is int and 0 <= x <= INT64_MAX:  # an int64 token id
                        if num_tokens < done + tpb:
                            known.append(x)
                            return done
                        if num_tokens < done + 2 * tpb and self._pages_only:
                            known.append(x)
                            return reuse.commit_next_page(self.tables, req)
            elif tokens is None and num_tokens <= req.base + len(known):
                if num_tokens < done + tpb:
                    return done
                if num_tokens < done + 2 * tpb and self._pages_only:
                    return reuse.commit_next_page(self.tables, req)
        if req is None:
            req = self.requests.get(rid)  # raises
        if not self.enable_reuse or req.dummy:
            return 0
        ids = None if tokens is None else check_few_tokens(tokens, f"request {rid}: commit's tokens")
        count = as_position(num_tokens, "commit's num_tokens")
        hist = self.tables.shape(req)[1]
        return reuse.commit(self.tables, req, count, ids, hist, state_snapshots=self.state_snapshots)

    def advance(self, rid: int, token: int | None = None) -> Resize:
        """One decode step of `rid`: the token in flight (at position
        `history`) has been computed, so history and capacity both advance by
        one, and with reuse on `token`, that token's id, is committed (the
        pages it completes become reusable). The same as `resize(rid,
        capacity + 1, history + 1)` then `commit(rid, history + 1, (token,))`,
        in one call. Falsy, nothing changed, if a pool is short. Raises
        `CacheUsageError`, before any change, for a token that is no token id
        or a request whose known ids do not reach its history (commit them
        first). `token=None` (or reuse off) commits nothing."""
        # Fast paths: no page moves (the mirror's bounds) and no page completes; a closed mirror
        # (hi = -1) fails `cap <= hi`. `array.append` checks the id's type and int64 range in C.
        # Next, a step that crosses a page boundary or completes a page (one in tpb): one move.
        try:
            req = self._by_id[rid]
        except KeyError:
            req = self.requests.get(rid)  # raises
        cap, hist = req.cap + 1, req.hist + 1
        known = req.tokens
        if token is None or (known is None and (req.dummy or not self.enable_reuse)):  # a move only
            if req.lo < cap <= req.hi and hist < req.nxt:
                req.cap = cap
                req.hist = hist
                return RESIZED
            if self._crosses and req.lo < cap and cross(self.tables, req, cap, hist, self._keeps_stale):
                return RESIZED
        elif (
            req.lo < cap <= req.hi
            and hist < req.nxt
            and known is not None
            and req.base + len(known) == req.hist
            and hist < (req.committed + 1) * self.tokens_per_block
        ):
            try:
                if token >= 0:
                    known.append(token)
                    req.cap = cap
                    req.hist = hist
                    return RESIZED
            except (TypeError, OverflowError):
                pass  # the checks below name the problem
        elif self._moves_across and advance_across(self.tables, req, token, self._keeps_stale):
            return RESIZED
        cap, hist = self.tables.shape(req)
        if token is not None and self.enable_reuse and not req.dummy:
            check_few_tokens((token,), f"request {rid}: advance's token")
            if req.num_known != hist:
                raise CacheUsageError(
                    f"request {rid}: advance commits the id of position {hist}, but {req.num_known} token ids "
                    "are known (commit the ids before it first)"
                )
        done = self.resize(rid, cap + 1, hist + 1)
        if done and token is not None:
            self.commit(rid, hist + 1, (token,))
        return done

    # ------------------------------------------------------------------ internals

    def _new_request(self, rid: int, *, dummy: bool) -> Request:
        if rid in self.requests:  # checked before a slot is taken (`Requests.add` would leak it)
            raise CacheUsageError(f"request id {rid!r} already exists")
        req = self.requests.add(rid, self.tables.acquire(), dummy=dummy)
        self.tables.start(req, NEVER if dummy else self.max_capacity)
        return req
