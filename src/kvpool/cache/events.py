"""What the manager reports: page events for KV-aware routers, statistics,
and the exceptions of the cache layer.

Pools log events as records, one per run of pages a call stored or evicted
(`EventRecord`), not one object per page; `expand` turns them into
`CacheEvent`s only when someone asks (`KVCacheManager.take_events`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias

from kvpool.errors import KvpoolError


class CacheEvent(NamedTuple):
    """One page gained (`stored`) or lost (`removed`) reusable content.

    `block_hash` is the chained hash of the page's tokens (and every token
    before it, and the salt); `parent_hash` the previous page's hash (None for
    the first page). `num_tokens` is the tokens the page covers. For a `state`
    group a stored event is a snapshot: the engine copies the request's state
    slot `source_page` into `page`. `medium` names the tier the page is in:
    "GPU", or a cold tier's "CPU" / "DISK" (`cache/tiers.py`), where `page` is
    that tier's slot.
    """

    kind: Literal["stored", "removed"]
    group: str
    block_hash: int
    parent_hash: int | None
    page: int
    num_tokens: int
    source_page: int | None = None
    medium: str = "GPU"


# ("stored", group, hashes, parent of hashes[0], pages, num_tokens, source_page): page i holds
# hashes[i], its parent is hashes[i - 1]; ("removed", group, hashes, pages). On the GPU; a cold
# tier's records add its medium: ("stored", ..., source_page, medium), ("removed", ..., pages, medium).
StoredRun: TypeAlias = tuple[Literal["stored"], str, list[int], int | None, list[int], int, int | None]
RemovedRun: TypeAlias = tuple[Literal["removed"], str, list[int], list[int]]
StoredRunIn: TypeAlias = tuple[Literal["stored"], str, list[int], int | None, list[int], int, int | None, str]
RemovedRunIn: TypeAlias = tuple[Literal["removed"], str, list[int], list[int], str]
EventRecord: TypeAlias = StoredRun | RemovedRun | StoredRunIn | RemovedRunIn


def as_signed(digest: int) -> int:
    """An unsigned 64-bit page digest as the signed int64 events carry."""
    return digest - ((digest >> 63) << 64)


def expand(records: Iterable[EventRecord]) -> list[CacheEvent]:
    """The `CacheEvent`s of `records`, oldest first (digests as signed int64)."""
    out: list[CacheEvent] = []
    for rec in records:
        if rec[0] == "stored":
            group, hashes, parent, pages, num_tokens, source = rec[1:7]
            medium = rec[7] if len(rec) > 7 else "GPU"
            up = None if parent is None else as_signed(parent)
            for h, page in zip(hashes, pages, strict=True):
                signed = as_signed(h)
                out.append(CacheEvent("stored", group, signed, up, page, num_tokens, source, medium))
                up = signed
        else:
            group, hashes, pages = rec[1:4]
            medium = rec[4] if len(rec) > 4 else "GPU"
            out.extend(
                CacheEvent("removed", group, as_signed(h), None, page, 0, None, medium)
                for h, page in zip(hashes, pages, strict=True)
            )
    return out


@dataclass(frozen=True)
class GroupStats:
    """Pages of one pool group right now. `total = free + used`; `cached` of
    the free pages still hold reusable content; `dummy` and `reserved` of the
    used pages belong to dummy requests and to persistent padding dummies."""

    total: int
    free: int
    used: int
    cached: int
    dummy: int
    reserved: int


@dataclass(frozen=True)
class CacheStats:
    """`groups` per group name; reuse counters are cumulative token counts over
    every `create` with tokens (queried) and the tokens it reused (hit)."""

    groups: dict[str, GroupStats]
    reuse_queried_tokens: int
    reuse_hit_tokens: int
    num_requests: int
    num_dummies: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.reuse_hit_tokens / self.reuse_queried_tokens if self.reuse_queried_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": {name: vars(g).copy() for name, g in self.groups.items()},
            "reuse_queried_tokens": self.reuse_queried_tokens,
            "reuse_hit_tokens": self.reuse_hit_tokens,
            "hit_rate": self.hit_rate,
            "num_requests": self.num_requests,
            "num_dummies": self.num_dummies,
        }


class CacheUsageError(KvpoolError, ValueError):
    """A call the manager cannot honour: unknown or duplicate request id,
    capacity below history, history moving backwards, bad counts."""


class CacheIntegrityError(AssertionError):
    """The page bookkeeping is inconsistent (a kvpool bug); `pages` maps each
    group name to the offending page ids."""

    def __init__(self, message: str, pages: dict[str, list[int]]) -> None:
        super().__init__(message)
        self.pages = pages
