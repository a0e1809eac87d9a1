"""The manager's record of one request, and the registry of requests by id.

A `Request` is the one source of truth for a request's shape: its capacity and
history, and per group its table's block count, stale count and the history at
which the next block goes stale. The page ids themselves live in the page
tables (`cache/tables.py`), one row per request (`slot`). The record also keeps
what prefix reuse needs (`cache/prefix.py`): the reuse scope, the token ids
past the digested pages, the page digests, and how many leading pages were
offered for reuse.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field

from kvpool.cache.checks import as_list
from kvpool.cache.events import CacheUsageError
from kvpool.cache.hashing import Chain


@dataclass(slots=True, eq=False)
class Request:
    """One registered request.

    Shape: `cap`/`hist`; per group `nblk` (table entries, stale ones included),
    `nstale` (leading entries without a page) and `stale_at` (the smallest
    history at which `nstale` grows). `lo`, `hi` and `next_stale` summarise
    them (`PageTables.rebound`): any capacity in `(lo, hi]` with a history
    below `next_stale` moves no page in any group; `hi` never passes `limit`,
    the largest capacity the request may have.

    Reuse: `seed` (from the salt), the token ids known past the first `base`
    (the whole pages already digested into `hashes`, whose ids are not needed
    again: a long prompt is not kept twice), and `committed`, the leading whole
    pages already offered for reuse. `lookup`: the (queried, hit) tokens of the
    prompt's prefix lookup, until the first resize that succeeds counts them."""

    # the fields a decode step reads first, so that they share the record's first cache lines
    rid: int
    cap: int = 0
    hist: int = 0
    lo: int = -1
    hi: int = 0
    next_stale: int = 0
    lookup: tuple[int, int] | None = None
    tokens: array[int] | None = None
    base: int = 0
    committed: int = 0
    _: KW_ONLY
    slot: int
    dummy: bool
    limit: int
    nblk: list[int]
    nstale: list[int]
    stale_at: list[int]
    seed: int = 0
    salt: object = None  # the scope `seed` digests, as the caller gave it (events publish it)
    chain: Chain | None = None  # the page digest (None: kvpool's own; `cache/vllm_hashes.py`)
    hashes: list[int] = field(default_factory=list)
    # digests of pages past `hashes` computed ahead from ids to come (`prefix.first_shared_fill`):
    # (their first page, its parent's digest, the pages' ids and maybe more, the digests), for the commit after
    ahead: tuple[int, int, array[int], list[int]] | None = None

    @property
    def num_known(self) -> int:
        """Token ids known so far, the digested pages' included."""
        return 0 if self.tokens is None else self.base + len(self.tokens)

    def live(self, gi: int) -> int:
        """Pages the request holds in group `gi`."""
        return self.nblk[gi] - self.nstale[gi]


class Requests:
    """Request ids -> `Request`. Real requests use the caller's ids (use
    non-negative ones); dummies get negative ids, the freed ones closest to -1
    first, so warmup reports stay readable."""

    def __init__(self) -> None:
        self.by_id: dict[int, Request] = {}  # requests whose pages are on the GPU
        self.suspended: dict[int, Request] = {}  # requests whose pages a cold tier holds (`cache/tiers.py`)
        self.next_dummy = -1
        self.free_dummy_ids: list[int] = []  # heap of -id
        # the last batch `batch` answered (its ids as a list or tuple of the caller's type, copied):
        # a decode loop asks for the same batch every step
        self.last_batch: tuple[list[int] | tuple[int, ...], list[Request]] | None = None
        self.pending_lookups = 0  # registered requests whose `lookup` is not counted yet (a batch asks once)

    def __contains__(self, rid: object) -> bool:
        return rid in self.by_id or rid in self.suspended

    def __len__(self) -> int:
        """Requests on the GPU (suspended ones not)."""
        return len(self.by_id)

    def __iter__(self) -> Iterator[Request]:
        """Requests on the GPU (suspended ones not)."""
        return iter(self.by_id.values())

    def get(self, rid: int) -> Request:
        """The request `rid`; CacheUsageError when it is not registered (or not
        an int: `True`, `1.0` and `np.int64(1)` hash like 1 and would find it)."""
        if type(rid) is not int:
            raise CacheUsageError(f"request ids are ints, got {rid!r} ({type(rid).__name__})")
        try:
            return self.by_id[rid]
        except (KeyError, TypeError):
            if rid in self.suspended:
                raise CacheUsageError(f"request {rid!r} is suspended (resume it first)") from None
            raise CacheUsageError(f"unknown request id {rid!r}") from None

    def record(self, rid: int) -> Request:
        """The request `rid`, suspended or not; CacheUsageError when it is not registered."""
        req = self.suspended.get(rid) if type(rid) is int else None
        return self.get(rid) if req is None else req

    def suspend(self, rid: int) -> None:
        """Move `rid` to the suspended requests (its moves raise until `resume`)."""
        self.suspended[rid] = self.by_id.pop(rid)
        self.last_batch = None

    def resume(self, rid: int) -> None:
        """Move suspended `rid` back."""
        self.by_id[rid] = self.suspended.pop(rid)
        self.last_batch = None

    def register(self, rid: int, make: Callable[[int], Request]) -> Request:
        """Register the request `make(rid)` makes (a fresh table row) and return
        it; CacheUsageError for an id registered already (suspended ones too),
        raised before `make` runs, so that no row is taken."""
        if rid in self:
            raise CacheUsageError(f"request id {rid!r} already exists")
        req = self.by_id[rid] = make(rid)
        self.last_batch = None
        return req

    def remove(self, rid: int) -> Request:
        """Forget `rid` (its id becomes reusable if it was a dummy's)."""
        req = self.by_id.pop(rid) if rid in self.by_id else self.suspended.pop(rid)
        self.last_batch = None
        if req.lookup is not None:
            self.pending_lookups -= 1
        if req.dummy:
            heapq.heappush(self.free_dummy_ids, -rid)
        return req

    def dummy_id(self) -> int:
        """A fresh negative id."""
        while self.free_dummy_ids:
            rid = -heapq.heappop(self.free_dummy_ids)
            if rid not in self.by_id:
                return rid
        while self.next_dummy in self.by_id:
            self.next_dummy -= 1
        rid = self.next_dummy
        self.next_dummy -= 1
        return rid

    def batch(self, rids: Sequence[int]) -> list[Request]:
        """The records of a batch of distinct registered requests (read-only:
        the same list answers the same batch until a request comes or goes)."""
        last = self.last_batch
        if last is not None and type(rids) is type(last[0]) and rids == last[0]:  # (a list or tuple)
            return last[1]
        # a copy (a tuple is its own); the scheduler's list without `as_list`'s abstract-class checks
        key: list[int] | tuple[int, ...] = (
            rids[:] if isinstance(rids, (list, tuple)) else list(as_list(rids, "a batch's request ids"))
        )
        if set(map(type, key)) - {int}:  # (the tests of a batch run in C: it changes most steps)
            bad = next(r for r in key if type(r) is not int)
            raise CacheUsageError(f"request ids are ints, got {bad!r} ({type(bad).__name__})")
        try:
            reqs = list(map(self.by_id.__getitem__, key))
        except KeyError as e:
            raise CacheUsageError(f"unknown request id {e.args[0]!r}") from None
        if len(set(key)) != len(key):  # distinct ints: distinct records
            raise CacheUsageError("a batch names the same request twice")
        self.last_batch = (key, reqs)
        return reqs
