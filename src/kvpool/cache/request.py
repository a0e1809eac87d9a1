"""The manager's record of one request, and the registry that maps request
ids to slots of the `SlotTables`.

A `Request` is shared, by design, between the manager and the functions that
work on its pages (`cache/reuse.py`, `cache/integrity.py`): they take the
tables and the request, never the manager.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvpool.cache.events import CacheUsageError


@dataclass(slots=True)
class Request:
    """One registered request: its id, its slot in the tables, the reuse scope
    (`seed`, from the salt), the token ids known so far (int64) past the first
    `base` (the whole pages already digested into `hashes`, whose ids are not
    needed again: a long prompt is not kept twice), their page hashes, and how
    many leading whole pages were already offered for reuse.

    The rest is the single-request path's mirror of the slot's numbers
    (`cache/shapes.py`): while `hi >= 0` the request's shape is `cap`/`hist`,
    its block counts and next-stale histories per group `nblks`, `nstales`,
    `nxts`, and any capacity in `(lo, hi]` (`hi` at most `limit`) with a
    history in `[hist, nxt)` moves no page in any group. `hi == -1`: no mirror."""

    rid: int
    slot: int
    seed: int = 0
    tokens: array[int] | None = None
    base: int = 0
    hashes: list[int] = field(default_factory=list)
    committed: int = 0
    dummy: bool = False
    cap: int = 0
    hist: int = 0
    lo: int = 0
    hi: int = -1
    nxt: int = 0
    limit: int = 0
    nblks: list[int] = field(default_factory=list)
    nstales: list[int] = field(default_factory=list)
    nxts: list[int] = field(default_factory=list)

    @property
    def num_known(self) -> int:
        """Token ids known so far, the digested pages' included (the decode
        fast paths in `cache/core.py` spell it out: a property call there costs
        more than the step)."""
        return 0 if self.tokens is None else self.base + len(self.tokens)


class Requests:
    """Request ids -> `Request`. Real requests use the caller's ids (use
    non-negative ones); dummies get negative ids, the freed ones closest to -1
    first, so warmup reports stay readable."""

    def __init__(self) -> None:
        self.by_id: dict[int, Request] = {}
        self.slot_of: dict[int, int] = {}
        self.next_dummy = -1
        self.free_dummy_ids: list[int] = []  # heap of -id
        # the last batch `slots` answered: a decode loop asks for the same batch every step
        self.last_batch: tuple[tuple[int, ...], npt.NDArray[np.intp]] | None = None

    def __contains__(self, rid: object) -> bool:
        return rid in self.by_id

    def __len__(self) -> int:
        return len(self.by_id)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.by_id.values())

    def get(self, rid: int) -> Request:
        """The request `rid`; CacheUsageError when it is not registered."""
        try:
            return self.by_id[rid]
        except KeyError:
            raise CacheUsageError(f"unknown request id {rid!r}") from None

    def add(self, rid: int, slot: int, *, dummy: bool) -> Request:
        """Register `rid` in `slot`; CacheUsageError for a duplicate id."""
        if rid in self.by_id:
            raise CacheUsageError(f"request id {rid!r} already exists")
        req = Request(rid, slot, dummy=dummy)
        self.last_batch = None
        self.by_id[rid] = req
        self.slot_of[rid] = slot
        return req

    def remove(self, rid: int) -> Request:
        """Forget `rid` (its id becomes reusable if it was a dummy's)."""
        req = self.by_id.pop(rid)
        del self.slot_of[rid]
        self.last_batch = None
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

    def slots(self, rids: Sequence[int]) -> npt.NDArray[np.intp]:
        """Slots of a batch of distinct registered requests (read-only: the
        same array answers the same batch until a request comes or goes)."""
        key = tuple(rids)
        if self.last_batch is not None and self.last_batch[0] == key:
            return self.last_batch[1]
        slot_of = self.slot_of
        try:
            slots = np.fromiter(map(slot_of.__getitem__, rids), np.intp, len(rids))
        except KeyError as e:
            raise CacheUsageError(f"unknown request id {e.args[0]!r}") from None
        if len(set(slots.tolist())) != len(slots):
            raise CacheUsageError("a batch names the same request twice")
        slots.flags.writeable = False
        self.last_batch = (key, slots)
        return slots
