"""What the prefix cache (`cache/prefix_hit.py`, `cache/prefix.py`) and
suspension (`cache/suspension.py`) ask of the cold tiers below the GPU pools:
one small interface, so that neither reaches into a tier's slots, LRU or pins.
`cache/tiers.py` keeps the tiers and implements it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from kvpool.media import Medium

Slots = list[list[int]]  # per group, tier slots (or GPU pages), in a request's page order


class ColdStore(ABC):
    """The cold tiers below the GPU pools, warm to cold, seen as one store. `gi`
    is a group's index. Pages move through the engine's `TierCopies`, when it set
    them (`KVCacheManager.set_tier_copies`); without them the moves are
    bookkeeping alone.

    Safety rules: a copy is asked for before anything can overwrite its source;
    a method that answers None changes nothing; one whose copy raises has undone
    its own pins before the exception goes on (what it evicted to make room stays
    evicted: those digests moved one tier down)."""

    @property
    @abstractmethod
    def copying(self) -> bool:
        """Whether the engine's copies are set: a move then calls them, and may raise."""

    @abstractmethod
    def keeps(self, gi: int) -> bool:
        """Whether group `gi`'s evicted pages go to the cold tiers. No side effect."""

    @abstractmethod
    def holder(self, gi: int, media: frozenset[Medium] | None = None) -> Callable[[int], bool]:
        """A test of whether a digest of group `gi` is held in a cold tier (of
        `media`, when given), for `keeps` groups. No side effect."""

    @abstractmethod
    def onboard(self, gi: int, digests: Sequence[int], take: Callable[[int], list[int]]) -> list[int]:
        """Copy `digests` of group `gi`, each held in a tier (`holder` said so),
        into the fresh GPU pages `take(len(digests))` returns, in order, and
        return those pages. Side effects: the digests become the most recently
        used where they are held (the first ones last, so that a tier making room
        moves a prefix's last pages down first); `take` may evict GPU pages into
        the tiers, and never into a slot being read (those are set aside while it
        runs). The tiers keep their copies."""

    @abstractmethod
    def park(self, pages: Sequence[Sequence[int]]) -> tuple[Medium, Slots] | None:
        """Pin slots for a suspended request's GPU `pages` (per group) in the
        warmest tier with room for all of them, copy each page into its slot and
        return (that tier, the slots); None, nothing changed, when no tier has room.
        The caller then releases the GPU pages."""

    @abstractmethod
    def missing(self, counts: Sequence[int]) -> list[int]:
        """Per group, the slots the coldest tier lacks for `counts[g]` pages (0
        where it has room). No side effect."""

    @abstractmethod
    def fetch(self, medium: Medium, slots: Sequence[Sequence[int]], pages: Sequence[Sequence[int]]) -> None:
        """Copy a parked request's `slots` in tier `medium` into the GPU `pages`
        (fresh, per group, in the same order). The slots stay pinned (`unpark`)."""

    @abstractmethod
    def unpark(self, medium: Medium, slots: Sequence[Sequence[int]]) -> None:
        """Give back the slots `park` pinned in tier `medium`."""
