"""What the manager reports: page events for KV-aware routers, statistics,
and the exceptions of the cache layer.

Pools log events as records, one per run of pages a call stored or evicted
(`EventRecord`), not one object per page; `expand` turns them into
`CacheEvent`s only when someone asks (`KVCacheManager.take_events`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias

from kvpool.errors import KvpoolError


class CacheEvent(NamedTuple):
    """One page gained (`stored`) or lost (`removed`) reusable content.

    `block_hash` is the chained hash of the page's tokens (and every token
    before it, and the salt); `parent_hash` the previous page's hash (None for
    the first page). `num_tokens` is the tokens the page covers. For a `state`
    group a stored event is a snapshot: the engine copies the request's state
    slot `source_page` into `page`; it covers the whole prefix up to and with
    this page (`num_tokens`). `medium` names the tier the page is in: "GPU",
    or a cold tier's "CPU" / "DISK" (`cache/tiers.py`), where `page` is that
    tier's slot. A stored event also carries the page's own token ids
    (`token_ids`, `tokens_per_block` of them; a snapshot's are its last page's)
    and the reuse scope they were hashed under (`salt`), so that a router can
    key on the tokens as llm-d's and Dynamo's indexers do; with lookahead
    digests (`KVCacheManager(hash_lookahead=L)`) `lookahead` holds the L ids
    after the page that its digest covers (vLLM 0.33's `lookahead_token_ids`).
    """

    kind: Literal["stored", "removed"]
    group: str
    block_hash: int
    parent_hash: int | None
    page: int
    num_tokens: int
    source_page: int | None = None
    medium: str = "GPU"
    token_ids: tuple[int, ...] = ()
    salt: object = None
    lookahead: tuple[int, ...] = ()


# ("stored", group, hashes, parent of hashes[0], pages, num_tokens, source_page, medium, ids, salt):
# page i holds hashes[i], its parent is hashes[i - 1], `ids` are the pages' token ids one page after
# the other (or None where the store carries none: a cold tier moves digests, not pages), `salt` the
# scope they were hashed under, then (lookahead digests only) how many ids after the last page `ids`
# also holds; a cold tier's record ends after `medium`, the GPU's older form after `source_page`.
# ("removed", group, hashes, pages[, medium]).
StoredRun: TypeAlias = tuple[Literal["stored"], str, list[int], int | None, list[int], int, int | None]
RemovedRun: TypeAlias = tuple[Literal["removed"], str, list[int], list[int]]
StoredRunIn: TypeAlias = tuple[Literal["stored"], str, list[int], int | None, list[int], int, int | None, str]
StoredRunIds: TypeAlias = tuple[
    Literal["stored"], str, list[int], int | None, list[int], int, int | None, str, Sequence[int] | None, object
]
RemovedRunIn: TypeAlias = tuple[Literal["removed"], str, list[int], list[int], str]
EventRecord: TypeAlias = StoredRun | RemovedRun | StoredRunIn | StoredRunIds | RemovedRunIn


class BlockBook:
    """What the events said each digest holds: its token ids, its parent and
    its salt, for as long as some group or tier holds it (the holders the
    events counted). A cold tier's stores and a state snapshot carry no ids of
    their own; the book gives them the ones the page was stored with, so that
    every stored event names its tokens. Kept by the manager, updated only by
    `expand`, which must see every record (the manager's buffer keeps the
    last 65,536)."""

    def __init__(self) -> None:
        self.blocks: dict[int, list[Any]] = {}  # unsigned digest -> [ids (int64 array), parent, salt, holders]

    def __len__(self) -> int:
        return len(self.blocks)

    def hold(
        self, digest: int, ids: Sequence[int], parent: int | None, salt: object, ahead: Sequence[int] = ()
    ) -> list[Any]:
        """One more holder of `digest`; its entry [ids, parent, salt, holders,
        lookahead ids] (ids and parent known before win)."""
        entry = self.blocks.get(digest)
        if entry is None:
            entry = self.blocks[digest] = [ids, parent, salt, 0, ahead]
        elif not entry[0] and ids:
            entry[0], entry[1], entry[2], entry[4] = ids, parent, salt, ahead
        entry[3] += 1
        return entry

    def release(self, digest: int) -> bool:
        """One holder fewer; True when none is left (the caller drops it later)."""
        entry = self.blocks.get(digest)
        if entry is None:
            return False
        entry[3] -= 1
        return bool(entry[3] <= 0)

    def drop_unheld(self, digests: Iterable[int]) -> None:
        for digest in digests:
            entry = self.blocks.get(digest)
            if entry is not None and entry[3] <= 0:
                del self.blocks[digest]


MASK64 = (1 << 64) - 1


def as_signed(digest: int) -> int:
    """A page digest's low 64 bits as the signed int64 `CacheEvent`s carry
    (kvpool's digests are 64-bit; vLLM's hashes, `hash="vllm:..."`, longer)."""
    low = digest & MASK64
    return low - ((low >> 63) << 64)


def expand(records: Iterable[EventRecord], book: BlockBook | None = None) -> list[CacheEvent]:
    """The `CacheEvent`s of `records`, oldest first (digests as signed int64).
    With a `book`, stores that carry no ids take the ones (and the parent and
    salt) their digest was stored with, and the book follows the records; a
    digest no one holds any more leaves it once the whole batch is expanded
    (a page moving to a cold tier is removed before the tier stores it)."""
    out: list[CacheEvent] = []
    released: list[int] = []
    for rec in records:
        if rec[0] == "stored":
            group, hashes, parent, pages, num_tokens, source = rec[1:7]
            tail: tuple[Any, ...] = rec[7:]  # a cold tier's medium; the GPU's ids, salt and lookahead
            medium, ids, salt, ahead = tail + ("GPU", None, None, 0)[len(tail) :]
            up = None if parent is None else as_signed(parent)
            width = (len(ids) - ahead) // len(hashes) if ids else 0
            for i, (h, page) in enumerate(zip(hashes, pages, strict=True)):
                signed = as_signed(h)
                block = ids[i * width : (i + 1) * width] if ids else ()
                after = ids[(i + 1) * width : (i + 1) * width + ahead] if ahead else ()
                if book is not None:
                    entry = book.hold(h, block, up, salt, after)
                    if not block:
                        block, salt, after = entry[0], entry[2], entry[4]
                        up = entry[1] if up is None else up
                out.append(
                    CacheEvent(
                        "stored", group, signed, up, page, num_tokens, source, medium, tuple(block), salt, tuple(after)
                    )
                )
                up = signed
        else:
            group, hashes, pages = rec[1:4]
            medium = rec[4] if len(rec) > 4 else "GPU"
            for h, page in zip(hashes, pages, strict=True):
                out.append(CacheEvent("removed", group, as_signed(h), None, page, 0, None, medium))
                if book is not None and book.release(h):
                    released.append(h)
    if book is not None and released:
        book.drop_unheld(released)
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
