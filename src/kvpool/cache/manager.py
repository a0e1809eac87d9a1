"""`KVCacheManager`: the run-time page manager of a `PoolPlan`.

One pool per group (`cache/pool.py`, `cache/shared_pool.py`), a record per
request (`cache/request.py`), block tables and the one move of a request's
pages (`cache/tables.py`) and the prefix cache (which hit a prompt has,
`cache/prefix_hit.py`; its pages, `cache/prefix.py`); dummy requests and the
CUDA-graph warmup dry run are page arithmetic in `plan.capture`, registered
here by `cache/dummies.py`.

Every move, single or batched, is the same: requests whose pages stay as they
are only take the new shape (the early return, the common decode step); the
others are planned, checked against the pools together, and applied all or
none (docs/design.md, rule 6; `cache/moves.py`).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from kvpool.cache import dummies, integrity, prefix, prefix_hit, suspension
from kvpool.cache.checks import (
    INT64_MAX,
    as_list,
    as_position,
    check_dummy_args,
    check_few_tokens,
    check_rid,
    check_shape,
    check_tokens,
    checked_shape,
    int_positions,
)
from kvpool.cache.dummies import PaddingDummies
from kvpool.cache.events import (
    BlockBook,
    CacheEvent,
    CacheStats,
    CacheUsageError,
    EventRecord,
    expand,
)
from kvpool.cache.hashing import LookaheadChain, Salt, extend_hashes
from kvpool.cache.moves import count_lookups, move, move_rows
from kvpool.cache.prefix_hit import TierHit
from kvpool.cache.prompt_memo import KnownPages, PromptMemo
from kvpool.cache.request import Request, Requests
from kvpool.cache.results import RESIZED, CreateCheck, Dummies, Resize
from kvpool.cache.rollback import attach_prefix_or_undo
from kvpool.cache.shared_pool import build_pools
from kvpool.cache.stats import cache_stats
from kvpool.cache.suspension import Suspended, Suspension
from kvpool.cache.tables import STALE, PageTables
from kvpool.cache.tiers import TierCopies, TierSpec, checked_copies, checked_tiers, tiers_below
from kvpool.cache.vllm_hashes import block_hasher
from kvpool.plan import capture
from kvpool.plan.capture import WarmupReport
from kvpool.plan.result import PoolPlan

__all__ = ["STALE", "KVCacheManager"]

EVENT_BUFFER = 1 << 16  # event records (runs of pages) kept until `take_events`; older ones are dropped


class KVCacheManager:
    """Run-time pages of a `PoolPlan`: one pool per group, page tables per request.

    Not thread-safe. Request ids are ints chosen by the caller (use
    non-negative ones: negative ids are the dummies').

    Every method that allocates returns a `Resize` (or `Dummies`) that is
    truthy on success and, on refusal, names the pages short per group and has
    changed nothing (`cache.results`). Usage errors raise `CacheUsageError`
    before anything changes. `tables`, `pools`, `requests` and `events` (records
    of runs of pages; `take_events` builds the `CacheEvent`s) are the
    bookkeeping, public for the integrity checker, tools and tests: read them,
    never write them. `events=False` records no events at all. `hash` names the
    page digest (kvpool's, or vLLM's `vllm:sha256_cbor` / `vllm:xxhash_cbor`);
    `hash_lookahead` L > 0 makes each page's digest also cover the L token ids
    after it, as vLLM 0.33 hashes when an EAGLE-family drafter reads ahead: a
    page is then stored (and its event, with `lookahead` ids, published) only
    once those ids are committed.

    The constructor raises `CacheUsageError` for `tiers` that are not a list of
    `TierSpec`, a `max_util_for_resume` outside (0, 1], or a pool or tier of more
    pages than `cache.pool.MAX_PAGES`.

    `state_snapshots=True` lets `commit` snapshot state groups (recurrent
    state) so that models with a state group can reuse prefixes at all; the
    engine must then copy each snapshot (see `CacheEvent.source_page`). Off by
    default: a hit on a snapshot the engine never filled would be silently wrong.
    """

    def __init__(
        self,
        plan: PoolPlan,
        *,
        enable_reuse: bool = True,
        state_snapshots: bool = False,
        events: bool = True,
        tiers: Sequence[TierSpec] = (),
        max_util_for_resume: float = 0.95,
        hash: str = "kvpool",  # noqa: A002 (the engines' own word for it)
        hash_lookahead: int = 0,
    ) -> None:
        tiers, tier_slots, max_util_for_resume = checked_tiers(plan, tiers, max_util_for_resume)
        self.hash = hash
        self._seed_of, self._chain = block_hasher(hash)  # kvpool's digest, or vLLM's (`cache/vllm_hashes.py`)
        self.hash_lookahead = hash_lookahead
        if hash_lookahead:  # vLLM 0.33's lookahead hashes: a page's digest also covers the ids after it
            self._chain = LookaheadChain(self._chain, hash_lookahead)
        self.plan = plan
        self.spec = plan.spec
        self.limits = plan.limits
        self.enable_reuse = enable_reuse
        self.state_snapshots = state_snapshots
        self.tokens_per_block = self.spec.tokens_per_block
        self.groups = self.spec.groups
        self._index = {g.name: i for i, g in enumerate(self.groups)}
        self.events: deque[EventRecord] = deque(maxlen=EVENT_BUFFER)
        self.blocks = BlockBook()  # what the events said each held digest holds (`take_events`)
        self.pools = build_pools(plan, self.events)  # one per group; shared stores where the plan shares a pool
        for pool in self.pools:
            pool.record_events = events
        self.max_capacity = self.limits.max_seq_len + self.limits.headroom  # what the pools were sized for
        self.tables = PageTables(self.groups, self.pools, max(8, self.limits.max_batch_size + 8), self.max_capacity)
        # with reuse on, pages that leave a sliding window or a finished chunk are stored before they are released
        if enable_reuse and not all(self.tables.never_stale):
            self.tables.before_release = partial(prefix.store_leaving, self.tables)
        # a commit may snapshot a state group even when no page completes (`prefix.commit`)
        self._snapshots = state_snapshots and any(self.tables.is_state)
        self.requests = Requests()
        self._new_row = partial(self.tables.new_request, dummy=False, limit=self.max_capacity)  # a real request's
        self._by_id = self.requests.by_id  # the per-step lookup (no method call)
        self.reuse_queried_tokens = 0
        self.reuse_hit_tokens = 0
        self._prompts = PromptMemo()  # the last prompt's digests, for the next that shares its start
        self._padding = PaddingDummies()  # draft length -> persistent padding dummy id
        # the warmest cold tier (None: the GPU alone)
        self.tier = tiers_below(
            self.pools,
            tiers,
            tier_slots,
            self.tables.never_stale,
            enable_reuse,
            self.tokens_per_block,
            self.events,
            events,
        )
        self.max_util_for_resume = max_util_for_resume
        self._suspended = Suspended()  # request id -> where its pages are

    # ------------------------------------------------------------------ requests

    def create(self, rid: int, tokens: Sequence[int] | None = None, salt: Salt = None) -> int:
        """Register request `rid` (capacity 0). With reuse on and `tokens` (the
        prompt) given, attach the longest cached prefix of whole pages (never
        the last prompt token, which must be computed for logits): capacity and
        history become the reused length, which is returned. The lookup counts
        in `stats()` once the request's first resize succeeds: a scheduler that
        creates, finds no room and frees again does not inflate the hit rate.
        Raises `CacheUsageError` for a duplicate or non-int id, tokens that
        are not token ids, or a salt of another type (nothing registered then)."""
        check_rid(rid)
        ids = None
        if self.enable_reuse and tokens is not None:
            # the ids `can_create` just checked are taken as they are, unless events are recorded: the
            # request then keeps its ids (and appends to them), which must be its own
            same = None if self.pools[0].record_events else self._prompts.same_ids(tokens)
            ids = check_tokens(tokens, "tokens", rid=rid) if same is None else same
        seed = self._seed_of(salt) if self.enable_reuse else 0  # also for ids that come later, with `commit`
        req = self.requests.register(rid, self._new_row)
        req.seed, req.salt, req.chain = seed, salt, self._chain
        if ids is None:
            return 0
        req.tokens = ids
        try:
            hit = attach_prefix_or_undo(self.tables, req, self._prompts, self.tier, self.events)
        except BaseException:
            if req.slot in self.tables.free_slots:  # undone: a copy from a cold tier raised
                self.requests.remove(rid)
            raise
        req.lookup = (len(ids), hit)
        self.requests.pending_lookups += 1
        return hit

    def cached_prefix(self, tokens: Sequence[int], salt: Salt = None) -> TierHit:
        """The tokens of `tokens` (whole pages) this cache holds reusable under
        `salt`, per tier (`TierHit`: GPU alone, with the host tier, with every
        tier), each group by its kind's rule: what a router's index of this
        manager's events answers (`kvpool.index`, Dynamo's KV indexer).
        Changes nothing. `create` of a prompt that goes on after `tokens`
        reuses `disk` of them when the GPU has room for the pages it copies in
        from the tiers (and never the prompt's last token)."""
        items = tokens if type(tokens) is list or type(tokens) is tuple else as_list(tokens, "cached_prefix's tokens")
        if any(type(t) is bool for t in items):  # (check_tokens reads True as 1; a router's query never means it)
            raise CacheUsageError("cached_prefix's tokens must be token ids, not bools")
        ids = check_tokens(items, "cached_prefix's tokens")
        hashes: list[int] = []
        if self.enable_reuse:
            extend_hashes(
                hashes, ids, self.tokens_per_block, self._seed_of(salt), len(ids) // self.tokens_per_block, self._chain
            )
        return prefix_hit.cached_prefix(self.tables, hashes, self.tier)

    def can_create(
        self, tokens: Sequence[int] | None = None, salt: Salt = None, num_tokens: int = 1, *, frozen: bool = False
    ) -> CreateCheck:
        """What `create(rid, tokens, salt)` and then `resize(rid, hit +
        num_tokens, hit)` would answer now, changing nothing (the LRU order
        stays as it was): the tokens the prefix hit would reuse and, falsy,
        the pages short per pool (`prefix_hit.create_check`). A scheduler asks
        this of the head of its queue before it registers it, as vLLM counts
        the blocks before it touches a cached one. Raises `CacheUsageError`
        for tokens that are not token ids or a bad `num_tokens`.

        The manager keeps the ids it digests (`CreateCheck.ids`), a copy of
        `tokens`. `frozen=True` promises that `tokens`, where it is an int64
        array (`array("q")`), is never written again, only appended to (a
        scheduler's `Sequence.token_ids`): the manager then keeps that array
        itself, checked, and copies no prompt."""
        n = as_position(num_tokens, "can_create's num_tokens")
        hashes: list[int] = []
        known: dict[int, KnownPages] = {}
        ids = None
        if self.enable_reuse and tokens is not None:
            items = tokens if type(tokens) is array else as_list(tokens, "can_create's tokens")
            if type(items) is not array and any(type(t) is bool for t in items):  # a scheduler passes an int64 array
                raise CacheUsageError("can_create's tokens must be token ids, not bools")
            same = self._prompts.same_ids(items)  # the head of a queue, asked again: checked when first asked
            ids = check_tokens(items, "can_create's tokens", copy=not frozen) if same is None else same
            if ids:
                tpb = self.tokens_per_block
                hashes, known = self._prompts.digests(
                    ids, tpb, self._seed_of(salt), (len(ids) - 1) // tpb, self.pools, self._chain
                )
        return prefix_hit.create_check(self.tables, hashes, self._prompts, known, self.tier, n, ids)

    def free(self, rid: int) -> None:
        """Release every page of `rid` (cached content stays reusable until
        evicted) and forget the request; a padding dummy stops being reserved."""
        req = self.requests.record(rid)
        parked = self._suspended.by_id.pop(rid, None)
        if parked is None or self.tier is None:
            self.tables.release(req)
        else:  # its pages are in a cold tier, its row is empty
            suspension.release(parked, self.tier)
            self.tables.free_slots.append(req.slot)
        self.requests.remove(rid)
        if req.dummy:
            self._padding.forget(rid)

    def __contains__(self, rid: object) -> bool:
        return rid in self.requests

    def capacity(self, rid: int) -> int:
        req = self._by_id.get(rid) if type(rid) is int else None  # early return: a request on the GPU
        return (req if req is not None else self.requests.record(rid)).cap

    def history(self, rid: int) -> int:
        return self.requests.record(rid).hist

    @property
    def num_requests(self) -> int:
        """Registered requests on the GPU, dummies included (suspended ones not)."""
        return len(self.requests.by_id)

    def iter_requests(self) -> Iterable[tuple[int, bool]]:
        """(rid, is_dummy) of every request on the GPU (suspended ones not)."""
        return ((r.rid, r.dummy) for r in self.requests)

    # ------------------------------------------------------------------ suspend and resume

    def suspend(self, rid: int) -> Resize:
        """Move `rid`'s live pages to the warmest cold tier with room for all
        of them (pinned there; `suspension(rid)` says which GPU page goes to
        which slot) and release its GPU pages. The request keeps its shape;
        it may not move until `resume`. Falsy, nothing changed, when no tier
        has room (the pages short per group, in the coldest tier). Raises
        `CacheUsageError` without a cold tier, for a dummy, or for an unknown or
        suspended request."""
        req = self.requests.get(rid)
        if self.tier is None or req.dummy:
            raise CacheUsageError(f"request {rid}: suspend needs a cold tier (tiers=...) and a real request")
        return self._suspended.suspend(self.tables, self.requests, req, self.tier)

    def resume(self, rid: int) -> Resize:
        """Bring suspended `rid`'s pages back into fresh GPU pages (the engine
        copies them from the slots `suspension(rid)` named) and unpin them.
        Falsy, nothing changed, when a pool lacks the pages or would be used
        past `max_util_for_resume` of its pages afterwards (TensorRT-LLM V2's
        rule, keeping room for the running requests to grow)."""
        return self._suspended.resume(self.tables, self.requests, rid, self.tier, self.max_util_for_resume)

    def suspension(self, rid: int) -> Suspension | None:
        """Where suspended `rid`'s pages are (None: it is not suspended)."""
        return self._suspended.by_id.get(self.requests.record(rid).rid)

    def set_tier_copies(self, copies: TierCopies) -> None:
        """Have `copies` (an engine's) move the bytes whenever pages move
        between the GPU and the cold tiers."""
        if self.tier is None:
            raise CacheUsageError("set_tier_copies needs a cold tier (tiers=...)")
        copies = checked_copies(copies)
        for level in self.tier.levels():
            level.copies = copies

    # ------------------------------------------------------------------ moves

    def resize(self, rid: int, capacity: int, history: int | None = None) -> Resize:
        """Give `rid` pages for `capacity` positions with `history` of them
        computed (None: unchanged); raising history releases pages that went
        stale. All groups or nothing: a falsy result, naming the pages short
        per group, changed nothing. Raises `CacheUsageError` if capacity <
        history, history decreases or capacity passes max_seq_len + headroom."""
        req = self._by_id.get(rid) if type(rid) is int else None  # True and 1.0 would find request 1
        if req is not None and type(capacity) is int:
            hist = req.hist if history is None else history
            if type(hist) is int and req.hist <= hist <= capacity <= req.limit:  # a valid shape
                if req.lo < capacity <= req.hi and hist < req.next_stale and req.lookup is None:
                    req.cap = capacity  # early return: no page moves
                    req.hist = hist
                    return RESIZED
                return move(self, ((req, capacity, hist),))
        if req is None:
            req = self.requests.get(rid)  # raises
        cap, hist = checked_shape(rid, capacity, history, req.hist, None if req.dummy else self.max_capacity)
        return move(self, ((req, cap, hist),))

    def advance(self, rid: int, token: int | None = None) -> Resize:
        """One decode step of `rid`: the token in flight (at position
        `history`) has been computed, so history and capacity both advance by
        one, and with reuse on `token`, that token's id, is committed (the
        pages it completes become reusable). The same as `resize(rid,
        capacity + 1, history + 1)` then `commit(rid, history + 1, (token,))`.
        Falsy, nothing changed, if a pool is short. Raises `CacheUsageError`,
        before any change, for a token that is no token id or a request whose
        known ids do not reach its history (commit them first). `token=None`
        (or reuse off) commits nothing."""
        try:
            req = self._by_id[rid]
        except (KeyError, TypeError):  # unknown, suspended or unhashable: `requests.get` names it
            return self._advance(self.requests.get(rid), token)
        if req.rid is not rid and type(rid) is not int:  # True and 1.0 would find request 1
            return self._advance(self.requests.get(rid), token)
        cap, hist = req.cap + 1, req.hist + 1
        if cap <= req.hi and hist < req.next_stale and req.lookup is None:
            # early return: no page moves, and no page completes (or nothing to commit)
            if token is None:
                req.cap = cap
                req.hist = hist
                return RESIZED
            known = req.tokens
            if known is not None:  # reuse on, no dummy: commit the id
                # (no state snapshot is due: one is due only at a history of committed whole pages, and
                # committed * tpb <= req.hist < hist < (committed + 1) * tpb)
                if req.base + len(known) == req.hist and hist < (req.committed + 1) * self.tokens_per_block:
                    try:  # a plain id >= 0 (0 and 1 no bools), appended as int64 (checked in C)
                        if token > 1 or type(token) is int and token >= 0:
                            known.append(token)
                            req.cap = cap
                            req.hist = hist
                            return RESIZED
                    except (TypeError, OverflowError):
                        pass  # `_advance` names it
            elif req.dummy or not self.enable_reuse:
                req.cap = cap
                req.hist = hist
                return RESIZED
        if token is None:  # the move alone (a capacity past the limit raises there)
            return move(self, ((req, cap, hist),))
        return self._advance(req, token)

    def _advance(self, req: Request, token: int | None) -> Resize:
        """`advance` where a page may move or complete: the move, then (reuse on,
        no dummy, a token given) the checks before it and the commit after."""
        if token is None or not self.enable_reuse or req.dummy:
            return move(self, ((req, req.cap + 1, req.hist + 1),))  # (a capacity past the limit raises there)
        if type(token) is not int or not 0 <= token <= INT64_MAX:  # (the message is built for a bad id only)
            check_few_tokens((token,), f"request {req.rid}: advance's token")
        known = req.tokens
        if (0 if known is None else req.base + len(known)) != req.hist:
            raise CacheUsageError(
                f"request {req.rid}: advance commits the id of position {req.hist}, but {req.num_known} "
                "token ids are known (commit the ids before it first)"
            )
        cap, hist = req.cap + 1, req.hist + 1
        if cap <= req.hi and hist < req.next_stale and req.lookup is None:  # no page moves: a page completes
            req.cap, req.hist = cap, hist
        else:
            done = move(self, ((req, cap, hist),))
            if not done:
                return done
            known = req.tokens  # (a commit on the way may have dropped committed ids: a new array)
        if known is None:
            known = req.tokens = array("q")
        known.append(token)  # checked above
        prefix.commit(self.tables, req, hist, None, state_snapshots=self.state_snapshots)
        return RESIZED

    def resize_many(
        self, rids: Sequence[int], capacities: npt.ArrayLike, histories: npt.ArrayLike | None = None
    ) -> Resize:
        """`resize` for a batch of distinct requests in one call, atomic over the
        whole batch (falsy: nothing changed). The per-step decode path."""
        reqs = self.requests.batch(rids)
        caps = int_positions(capacities, len(reqs), "capacities")
        hists = [r.hist for r in reqs] if histories is None else int_positions(histories, len(reqs), "histories")
        rows: list[tuple[Request, int, int]] = []
        for req, cap, hist in zip(reqs, caps, hists, strict=True):  # every shape checked before anything changes
            if not req.hist <= hist <= cap:
                check_shape(req.rid, cap, hist, req.hist)  # raises
            if not (req.lo < cap <= req.hi and hist < req.next_stale):
                rows.append((req, cap, hist))  # pages move
        if rows:
            done = move(self, rows)  # (a capacity past the limit raises there, before any change)
            if not done:
                return done
        for req, cap, hist in zip(reqs, caps, hists, strict=True):  # the others: the early return
            req.cap = cap
            req.hist = hist
        if self.requests.pending_lookups:
            count_lookups(self, reqs)
        return RESIZED

    def extend(self, rids: Sequence[int], num_tokens: int = 1) -> Resize:
        """One decode step for a batch: capacity and history of each request
        both advance by `num_tokens` (the tokens in flight become computed and
        as many new ones get slots). Atomic over the batch like `resize_many`."""
        n = as_position(num_tokens, "extend's num_tokens")
        reqs = self.requests.batch(rids)
        rows: list[tuple[Request, int, int]] = []
        for req in reqs:
            cap, hist = req.cap + n, req.hist + n  # a valid shape, cap > req.lo as req.cap is
            if cap <= req.hi and hist < req.next_stale:
                req.cap = cap  # early return per request: no page moves
                req.hist = hist
            else:
                rows.append((req, cap, hist))
        return move_rows(self, reqs, rows, lambda j: (reqs[j].cap - n, reqs[j].hist - n))

    def can_resize(self, rid: int, capacity: int, history: int | None = None) -> Resize:
        """What `resize(rid, capacity, history)` would answer now; changes nothing."""
        req = self.requests.get(rid)
        cap, hist = checked_shape(rid, capacity, history, req.hist, None if req.dummy else self.max_capacity)
        short = self.tables.shortfall([self.tables.plan(req, cap, hist)])
        return Resize(short) if short else RESIZED

    def commit(self, rid: int, num_tokens: int, tokens: Sequence[int] | None = None) -> int:
        """Offer the whole pages among the first `num_tokens` positions of `rid`
        for reuse (chained hashes of token ids and the salt; records `stored`
        events). `tokens` appends token ids the manager has not seen yet (the
        prompt came with `create`; pass generated tokens here). Commit only
        verified tokens, never drafts: `num_tokens` may not exceed history.
        Returns the tokens now reusable; a no-op (0) with reuse off or for dummies."""
        req = self._by_id.get(rid) if type(rid) is int else None  # True and 1.0 would find request 1
        if (  # early return: no page completes, no state to snapshot; one new plain token id or packed ones
            req is not None
            and (known := req.tokens) is not None  # so reuse is on and it is no dummy
            and not self._snapshots
            and type(num_tokens) is int
            and 0 <= num_tokens <= req.hist
            and num_tokens < (req.committed + 1) * self.tokens_per_block
        ):
            if tokens is None:
                if num_tokens <= req.base + len(known):
                    return req.committed * self.tokens_per_block
            elif type(tokens) is tuple and len(tokens) == 1 and num_tokens <= req.base + len(known) + 1:
                x = tokens[0]
                if type(x) is int and 0 <= x <= INT64_MAX:
                    known.append(x)
                    return req.committed * self.tokens_per_block
            elif type(tokens) is array and num_tokens <= req.base + len(known) + len(tokens):
                known.extend(check_tokens(tokens, "commit's tokens", copy=False, rid=rid))
                return req.committed * self.tokens_per_block
        if req is None:
            req = self.requests.get(rid)  # raises
        if not self.enable_reuse or req.dummy:
            return 0
        ids = None
        if tokens is not None:  # (packed ids are only read: `prefix.commit` appends them to the request's own)
            what = "commit's tokens"
            ids = (
                check_tokens(tokens, what, copy=False, rid=rid)
                if type(tokens) is array
                else check_few_tokens(tokens, what, rid=rid)
            )
        count = as_position(num_tokens, "commit's num_tokens")
        return prefix.commit(self.tables, req, count, ids, state_snapshots=self.state_snapshots)

    def first_shared_fill(self, rid: int, tokens: Sequence[int], upto: int) -> int | None:
        """The first history up to `upto` at which `rid`, its history growing
        with the token ids `tokens` after those the manager has, fills a page
        whose commit depends on the evictions before it: a page whose digest
        another page holds (cached: the commit stores no copy unless that page
        was evicted first), or the first page, when another page holds its
        parent's. A caller that raises history several positions before it
        commits (a run of decode steps) must commit such a page no later than
        the step that fills it, or it may store what single steps do not.
        None when no such page fills (or reuse is off); changes nothing."""
        req = self.requests.get(rid)
        ids = check_tokens(tokens, "first_shared_fill's tokens", copy=False, rid=rid)  # only read
        count = as_position(upto, "first_shared_fill's upto")
        if not self.enable_reuse or req.dummy:
            return None
        return prefix.first_shared_fill(self.tables, req, ids, count)

    def unused_pages(self, group: str) -> int:
        """Pages of `group` an allocation can take without evicting a cached one."""
        return len(self.pools[self._group(group)].free_stack)

    # ------------------------------------------------------------------ dummies and warmup

    def add_dummy_requests(self, batch_size: int, token_num: int, draft_len: int = 0, is_gen: bool = True) -> Dummies:
        """Register `batch_size` dummy requests of `token_num` tokens, all or
        nothing: a generation dummy gets capacity `token_num + draft_len + E`
        and history `token_num - 1` (rule 2; sliding groups then hold only the
        window), a context dummy capacity `token_num + E` and history 0. The
        result holds their (negative) ids, each released with `free`; falsy
        (nothing changed, the pages short named) when they do not fit."""
        return dummies.add_dummies(self, batch_size, token_num, draft_len, is_gen)

    def max_generation_length(self, batch_size: int, draft_len: int = 0) -> int:
        """Largest token_num (history + current input) the longest row of a
        decode batch of `batch_size` can have, the other rows being minimal
        decodes, given the pages free now; page-exact, capped at
        `limits.max_seq_len`, 0 if nothing fits (see `plan.capture`)."""
        check_dummy_args(batch_size, 1, draft_len)
        return capture.max_generation_length(self, batch_size, draft_len)

    def warmup(self, batch_sizes: Iterable[int] | None = None, draft_lens: Iterable[int] = (0,)) -> WarmupReport:
        """Dry-run CUDA-graph warmup for every (batch size, draft length)
        (default batch sizes: `limits.graph_batch_sizes`), then reserve one
        persistent padding dummy per draft length (see `padding_dummy`)."""
        return dummies.warmup(self, batch_sizes, draft_lens)

    def reserve_padding_dummy(self, draft_len: int = 0) -> int | None:
        """The persistent padding dummy for `draft_len` (a minimal generation
        dummy kept allocated so padded decode batches always have pages),
        reserving it now if needed; None if the pages are not there."""
        check_dummy_args(1, 1, draft_len)
        return self._padding.reserve(self, draft_len)

    def padding_dummy(self, draft_len: int = 0) -> int | None:
        """Id of the reserved padding dummy for `draft_len`, or None."""
        check_dummy_args(1, 1, draft_len)
        return self._padding.get(draft_len)

    # ------------------------------------------------------------------ readers

    def _group(self, name: str) -> int:
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise CacheUsageError(f"no group {name!r}; groups: {list(self._index)}") from None

    def pool_of(self, group: str) -> str:
        """The pool `group` takes pages from: the name of the shared pool it
        draws from with other groups (`PoolPlan.shared`), else its own name.
        Groups of one shared pool report that pool's free and total pages."""
        self._group(group)
        return self.plan.pool_of(group)

    def block_table(self, rid: int, group: str) -> npt.NDArray[np.int32]:
        """Page ids of `rid` in `group`, one per block of positions (a copy);
        `STALE` (-1) marks blocks without a page. A state group has one entry."""
        gi = self._group(group)
        return self.tables.row(self.requests.get(rid), gi).copy()

    def block_tables(self, rids: Sequence[int], group: str) -> npt.NDArray[np.int32]:
        """Block tables of a batch as one 2-D array padded with `STALE`."""
        gi = self._group(group)
        reqs = self.requests.batch(rids)
        width = max((r.nblk[gi] for r in reqs), default=0)
        return self.tables.tables[gi][[r.slot for r in reqs], :width]

    def free_pages(self, group: str) -> int:
        """Pages of `group` an allocation can take now (evictable cached ones included)."""
        return self.pools[self._group(group)].num_free

    def total_pages(self, group: str) -> int:
        return self.pools[self._group(group)].num_pages

    def live_pages(self, rid: int, group: str) -> int:
        """Pages `rid` holds in `group` now."""
        return self.requests.get(rid).live(self._group(group))

    def held_pages(self, group: str) -> int:
        """Pages the tables of `group` name now, summed over requests (a page
        shared by a prefix hit counts once per holder); no side effects."""
        gi = self._group(group)
        return sum(r.live(gi) for r in self.requests)

    def take_events(self) -> list[CacheEvent]:
        """Stored/removed page events since the last call (oldest first), built
        now from the pools' records; clears them. Empty with `events=False`.
        Every stored event names its page's token ids and salt (a cold tier's
        and a snapshot's those the page was first stored with: `blocks`)."""
        events = expand(self.events, self.blocks)
        self.events.clear()
        return events

    def check_integrity(self) -> None:
        """Raise `CacheIntegrityError` (naming page ids per group) unless every
        page is exactly one of free, owned (ref count = owners) or cached,
        every table matches its request's shape, and every cold tier's slot is
        exactly one of free, cached or pinned by a suspended request, with no
        digest in two tiers, and the registry counts the pending prefix
        lookups it holds. O(pages); for tests and debugging."""
        integrity.check_integrity(self.tables, self.requests)
        integrity.check_lookups(self.requests)
        if self.tier is not None:
            integrity.check_tiers(self.tier, self.tables, self.requests.suspended.values(), self._suspended.by_id)

    def stats(self) -> CacheStats:
        """Pages per group (total, free, used, cached, dummy, reserved) and
        cumulative reuse counters; groups that share a pool report its total,
        free, used and cached pages."""
        return cache_stats(
            self.pools, self.requests, self._padding.ids(), self.reuse_queried_tokens, self.reuse_hit_tokens, self.tier
        )
