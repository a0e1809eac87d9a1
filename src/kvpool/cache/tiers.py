"""Colder tiers below the GPU pools: host memory and disk (TensorRT-LLM's KV
cache manager V2 keeps pages in such levels, warm to cold; docs/cache.md).

Pure bookkeeping: a tier holds, per group, `pages[group]` slots of the group's
page size; which digest each slot holds; and which slots suspended requests
hold. The engine copies the bytes (the events say from where to where).

- **Offload.** A committed page that the GPU pool evicts moves to the first
  cold tier instead of being dropped, if its group keeps it there (`keeps`:
  full and compressed pages and state snapshots; a sliding or chunked page
  that left its window is never worth keeping). A tier that is full evicts its
  least recently used digest to the next colder tier, or drops it at the last.
  A digest is kept in one cold tier at a time.
- **Onboard.** A prefix hit may use digests a cold tier holds; the manager
  copies them into fresh GPU pages (`cache/prefix.py`); the tier keeps its copy.
- **Suspend.** A suspended request's live pages are pinned in the warmest tier
  with room for all of them (`pin`), and unpinned when it resumes or is freed.

Events carry the tier as `medium` ("CPU", "DISK"), as vLLM's KV events do.
"""

from __future__ import annotations

import functools
import numbers
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvpool.cache.events import CacheUsageError, EventRecord
from kvpool.cache.pool import PagePool, check_pages
from kvpool.plan.result import PoolPlan
from kvpool.plan.tiers import tier_pages
from kvpool.units import format_bytes

Medium = Literal["CPU", "DISK"]


class TierCopies(Protocol):
    """What an engine does when pages move between the GPU pools and the cold
    tiers; the manager only keeps the books and calls these (`group` is the
    group's index) before anything can overwrite the source.

    A copy may fail (raise). One that offloads cached content (an evicted page
    into a tier, a tier's page one tier down) only costs that page: the tier
    does not keep it, as if it had no room, and `ColdTier.failed_copies` counts
    it. One that moves a request's own pages (`suspend`, `resume`, a prefix hit
    copied in by `create`) undoes the call: the books are as they were before it
    (`cache/rollback.py`), and the exception reaches the caller."""

    def to_tier(self, group: int, page: int, medium: Medium, slot: int) -> None:
        """Copy GPU page `page` into the tier's `slot`."""

    def to_gpu(self, group: int, medium: Medium, slot: int, page: int) -> None:
        """Copy the tier's `slot` into GPU page `page`."""

    def between(self, group: int, src: Medium, src_slot: int, dst: Medium, dst_slot: int) -> None:
        """Copy a slot of one tier into a slot of the next colder one."""


@dataclass(frozen=True)
class TierSpec:
    """A cold tier of one rank: `medium` ("CPU" for host memory, "DISK") and
    its byte quota. The manager splits the quota between groups in the
    proportions of the GPU plan (TensorRT-LLM V2's cold tiers do the same)."""

    medium: Medium
    bytes: int

    def __post_init__(self) -> None:
        if self.medium not in ("CPU", "DISK"):
            raise CacheUsageError(f"tier medium must be 'CPU' or 'DISK', got {self.medium!r}")
        if type(self.bytes) is not int or self.bytes < 0:
            raise CacheUsageError(f"tier bytes must be a non-negative int, got {self.bytes!r}")


def checked_specs(tiers: object) -> tuple[TierSpec, ...]:
    """`tiers` (a list or tuple of `TierSpec`) as a tuple, or CacheUsageError:
    a string, a mapping or a `None` entry is refused at the call, not deep inside
    the first offload."""
    if isinstance(tiers, str | bytes | Mapping) or not isinstance(tiers, Sequence):
        raise CacheUsageError(f"tiers must be a list of TierSpec, got {type(tiers).__name__} {tiers!r:.60}")
    bad = [t for t in tiers if not isinstance(t, TierSpec)]
    if bad:
        raise CacheUsageError(f"tiers must be a list of TierSpec, got {bad[0]!r:.60} in it")
    return tuple(tiers)


def checked_max_util(value: object) -> float:
    """`max_util_for_resume` as a float in (0, 1], or CacheUsageError: 0 or -1
    forbade every resume without a word, nan and strings failed at the first resume."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) <= 1:
        raise CacheUsageError(f"max_util_for_resume must be a share of the pool in (0, 1], got {value!r}")
    return float(value)


def checked_copies(copies: object) -> TierCopies:
    """`copies` if it has the three `TierCopies` methods, or CacheUsageError (before
    any page moves: a suspend would otherwise crash half-way through its copies)."""
    missing = [name for name in ("to_tier", "to_gpu", "between") if not callable(getattr(copies, name, None))]
    if missing:
        raise CacheUsageError(f"tier copies need methods to_tier, to_gpu and between; {copies!r:.60} lacks {missing}")
    return copies  # type: ignore[return-value]  # checked structurally above


def checked_tiers(
    plan: PoolPlan, tiers: object, max_util: object
) -> tuple[tuple[TierSpec, ...], list[list[int]], float]:
    """The manager's tier arguments checked (`checked_specs`, `checked_max_util`),
    with the slots per group of each cold tier (the GPU plan's proportions), once
    no pool or tier holds more pages than the books can keep (`pool.check_pages`):
    CacheUsageError naming what, before anything is allocated."""
    specs = checked_specs(tiers)
    return specs, checked_slots(plan, specs), checked_max_util(max_util)


def checked_slots(plan: PoolPlan, tiers: Sequence[TierSpec]) -> list[list[int]]:
    """The slots per group of each cold tier, each pool and tier checked (`checked_tiers`)."""
    for g in plan.groups:
        check_pages(g.pages, f"pool {g.name!r}")
    if tiers and plan.shared:
        raise CacheUsageError("cold tiers with a shared pool are not supported")
    slots = [list(tier_pages(plan, t.bytes).values()) for t in tiers]
    for t, counts in zip(tiers, slots, strict=True):
        for g, n in zip(plan.groups, counts, strict=True):
            check_pages(n, f"the {t.medium} tier ({format_bytes(t.bytes)}) for group {g.name!r}")
    return slots


class ColdTier:
    """One cold tier: per group, `pages[g]` slots; cached digests in LRU order
    (`held[g]`: digest -> slot, oldest first); slots pinned by suspended
    requests; the tier below (None: the last). Mutated only by the manager."""

    def __init__(
        self,
        medium: Medium,
        names: Sequence[str],
        pages: Sequence[int],
        keeps: Sequence[bool],
        tokens_per_block: int,
        events: deque[EventRecord],
        below: ColdTier | None,
    ) -> None:
        self.medium = medium
        self.names = tuple(names)
        self.pages = list(pages)
        self.keeps = list(keeps)
        self.tokens_per_block = tokens_per_block
        self.events = events
        self.record_events = True
        self.below = below
        self.held: list[OrderedDict[int, int]] = [OrderedDict() for _ in pages]
        self.free: list[list[int]] = [list(range(n - 1, -1, -1)) for n in pages]
        self.pinned = [0] * len(pages)
        self.copies: TierCopies | None = below.copies if below is not None else None  # the engine's, if any
        self.failed_copies = 0  # offloads into this tier whose copy raised (not kept)

    def __contains__(self, item: tuple[int, int]) -> bool:
        """(group, digest) cached in this tier or one below."""
        gi, digest = item
        tier: ColdTier | None = self
        while tier is not None:
            if digest in tier.held[gi]:
                return True
            tier = tier.below
        return False

    def put(self, gi: int, digests: Sequence[int], sources: Sequence[int], src: Medium | None = None) -> None:
        """Offload `digests` of group `gi` that a warmer level evicted from
        `sources[i]` (GPU pages, or slots of tier `src`): each goes to a free
        slot here (the least recently used held digest moving one tier down,
        or dropped, to make room), or to the tier below when no slot here can
        be freed; ignored where the group is not kept, no tier has a slot for
        it, or a tier already holds it."""
        if not self.keeps[gi]:
            return
        held = self.held[gi]
        for digest, source in zip(digests, sources, strict=True):
            if (gi, digest) in self:
                if digest in held:
                    held.move_to_end(digest)
                continue
            if not self.free[gi] and not self.make_room(gi, 1):
                # every slot here is set aside (a claim onboarding from it): the
                # page goes straight to the next level rather than being dropped
                if self.below is not None:
                    self.below.put(gi, [digest], [source], src)
                continue
            slot = self.free[gi].pop()
            if self.copies is not None and not self.copied(gi, source, src, slot):
                self.free[gi].append(slot)  # the copy failed: the page is not kept here
                continue
            held[digest] = slot
            self.record("stored", gi, [digest], [slot])

    def copied(self, gi: int, source: int, src: Medium | None, slot: int) -> bool:
        """Copy an offloaded page (GPU page `source`, or slot `source` of tier
        `src`) into `slot`; False, counted, when the engine's copy raised."""
        assert self.copies is not None
        try:
            if src is None:
                self.copies.to_tier(gi, source, self.medium, slot)
            else:
                self.copies.between(gi, src, source, self.medium, slot)
        except Exception:  # a failed offload loses one cached page, never the books (TierCopies)
            self.failed_copies += 1
            return False
        return True

    def locate(self, gi: int, digest: int) -> tuple[ColdTier, int] | None:
        """The tier (this or one below) and slot holding `digest` of group `gi`."""
        tier: ColdTier | None = self
        while tier is not None:
            slot = tier.held[gi].get(digest)
            if slot is not None:
                return tier, slot
            tier = tier.below
        return None

    def touch(self, gi: int, digest: int) -> None:
        """A hit read `digest`: it becomes the most recently used where it is held."""
        tier: ColdTier | None = self
        while tier is not None:
            if digest in tier.held[gi]:
                tier.held[gi].move_to_end(digest)
                return
            tier = tier.below

    def make_room(self, gi: int, count: int) -> bool:
        """Free `count` slots of group `gi` by moving the least recently used
        digests one tier down (or dropping them); False, nothing changed, when
        pinned slots leave too few."""
        held, free = self.held[gi], self.free[gi]
        if len(free) + len(held) < count:
            return False
        while len(free) < count:
            digest, slot = held.popitem(last=False)
            if self.below is not None:  # copied down before its slot is reused (and stored there first,
                self.below.put(gi, [digest], [slot], self.medium)  # as a GPU page's eviction is)
            self.record("removed", gi, [digest], [slot])
            free.append(slot)
        return True

    def pin(self, counts: Sequence[int]) -> list[list[int]] | None:
        """Slots for a suspended request's live pages, `counts[g]` per group,
        all groups or none (None: too few unpinned slots here)."""
        if any(n > len(self.free[gi]) + len(self.held[gi]) for gi, n in enumerate(counts)):
            return None
        out = []
        for gi, n in enumerate(counts):
            self.make_room(gi, n)
            out.append([self.free[gi].pop() for _ in range(n)])
            self.pinned[gi] += n
        return out

    def drop_slot(self, gi: int, slot: int) -> None:
        """Forget the digest `slot` of group `gi` holds, if any: its content can
        no longer be trusted (a copy into it was cut short)."""
        digest = next((d for d, s in self.held[gi].items() if s == slot), None)
        if digest is not None:
            del self.held[gi][digest]
            self.free[gi].append(slot)
            self.record("removed", gi, [digest], [slot])

    def unpin(self, slots: Sequence[Sequence[int]]) -> None:
        """Give back the slots `pin` returned."""
        for gi, group_slots in enumerate(slots):
            self.free[gi].extend(reversed(group_slots))
            self.pinned[gi] -= len(group_slots)

    def record(self, kind: Literal["stored", "removed"], gi: int, digests: list[int], slots: list[int]) -> None:
        if not self.record_events:
            return
        if kind == "stored":
            self.events.append(
                ("stored", self.names[gi], digests, None, slots, self.tokens_per_block, None, self.medium)
            )
        else:
            self.events.append(("removed", self.names[gi], digests, slots, self.medium))

    def levels(self) -> list[ColdTier]:
        """This tier and every one below it, warm to cold."""
        out: list[ColdTier] = []
        tier: ColdTier | None = self
        while tier is not None:
            out.append(tier)
            tier = tier.below
        return out


def build_tiers(
    specs: Sequence[TierSpec],
    pages: Sequence[Sequence[int]],
    names: Sequence[str],
    keeps: Sequence[bool],
    tokens_per_block: int,
    events: deque[EventRecord],
) -> ColdTier | None:
    """The cold tiers of `specs` (with `pages[i]` per group for `specs[i]`),
    warm to cold (host before disk), linked; None for none."""
    order = sorted(range(len(specs)), key=lambda i: ("CPU", "DISK").index(specs[i].medium))
    if len({specs[i].medium for i in order}) < len(order):
        raise CacheUsageError(f"one tier per medium, got {[s.medium for s in specs]}")
    below: ColdTier | None = None
    for i in reversed(order):
        below = ColdTier(specs[i].medium, names, pages[i], keeps, tokens_per_block, events, below)
    return below


def tiers_below(
    pools: Sequence[PagePool],
    specs: Sequence[TierSpec],
    pages: Sequence[Sequence[int]],
    never_stale: Sequence[bool],
    enable_reuse: bool,
    tokens_per_block: int,
    events: deque[EventRecord],
    record_events: bool,
) -> ColdTier | None:
    """The cold tiers of `specs` below the GPU `pools` (`pages[i]` per group
    for `specs[i]`), or None. A group's evicted digests spill into the first
    if it keeps them: with reuse on, groups whose pages never go stale (full
    and compressed pages, state snapshots), never a page that left a window."""
    keeps = [never and enable_reuse for never in never_stale]
    tier = build_tiers(specs, pages, [p.name for p in pools], keeps, tokens_per_block, events)
    if tier is None:
        return None
    for level in tier.levels():
        level.record_events = record_events
    for gi, pool in enumerate(pools):
        if keeps[gi]:
            pool.spill = functools.partial(tier.put, gi)
    return tier
