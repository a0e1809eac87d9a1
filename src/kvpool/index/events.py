"""vLLM's KV events as the index reads them: decoded msgpack values (a batch
`[ts, events, data_parallel_rank]`; each event a map with its tag under
`"type"`, or an array `[tag, field, ...]` in vLLM's positional order), turned
into three small frozen records. Field order and names follow
`vllm/distributed/kv_events.py` (0.32, 0.33); kvpool's own publisher emits
the same (`kvpool.cache.kv_wire`), so `wire_events(manager.take_events(),
manager.groups)` feeds an index in-process without encoding anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.cache.kv_wire import REMOVED_FIELDS, STORED_FIELDS
from kvpool.errors import KvpoolError

MASK64 = (1 << 64) - 1
# the field order of vLLM's array wire, as kvpool publishes it (read by name; trailing fields optional)
STORED_ORDER = STORED_FIELDS[0]
REMOVED_ORDER = REMOVED_FIELDS[0]

BlockHash = int | bytes  # vLLM sends unsigned 64-bit ints (or the digest bytes with int hashes off)


class EventFormatError(KvpoolError, ValueError):
    """A batch or event that is not vLLM's KV-event format."""


@dataclass(frozen=True)
class Stored:
    """`BlockStored`: chained blocks `block_hashes` after `parent` (None: the
    chain's first block), `token_ids` one block's after the other."""

    block_hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    kind: str | None = None
    sliding_window: int | None = None
    lookahead: tuple[tuple[int, ...], ...] | None = None  # per block, the ids after it its hash covers (vLLM 0.33)


@dataclass(frozen=True)
class Removed:
    """`BlockRemoved`: these blocks left `medium` (of group `group_idx`)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class Cleared:
    """`AllBlocksCleared`: the worker dropped everything (a reset or a restart)."""


Event = Stored | Removed | Cleared


def block_hash(value: Any) -> BlockHash:
    """An engine hash as the index keys it: ints as unsigned 64-bit (kvpool and
    older vLLM send signed ones), bytes as they are."""
    if isinstance(value, bool) or not isinstance(value, (int, bytes)):
        raise EventFormatError(f"a block hash is an int or bytes, got {value!r}")
    return value & MASK64 if isinstance(value, int) else value


def fields(raw: Any, order: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """(tag, fields by name) of one event, map or array."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        values = raw
    elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        values = dict(zip(order, raw[1:], strict=False))
    else:
        raise EventFormatError(f"a KV event is a tagged map or array, got {type(raw).__name__}")
    if not isinstance(tag, str):
        raise EventFormatError(f"a KV event needs its tag, got {raw!r:.80}")
    return tag, values


def stored_of(raw: Any) -> Stored:
    """A `BlockStored` event (a map or vLLM's array) as a record."""
    _, f = fields(raw, STORED_ORDER)
    try:
        keys = f.get("extra_keys")
        ahead = f.get("lookahead_token_ids")
        return Stored(
            tuple(map(block_hash, f["block_hashes"])),
            None if f.get("parent_block_hash") is None else block_hash(f["parent_block_hash"]),
            tuple(map(int, f["token_ids"])),
            int(f["block_size"]),
            f.get("medium"),
            f.get("lora_name"),
            None if keys is None else tuple(None if k is None else tuple(k) for k in keys),
            f.get("group_idx"),
            f.get("kv_cache_spec_kind"),
            f.get("kv_cache_spec_sliding_window"),
            None if ahead is None else tuple(tuple(map(int, a)) for a in ahead),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EventFormatError(f"BlockStored without a valid {exc}") from None


def parse_event(raw: Any) -> Event:
    """One decoded event as a record; EventFormatError when it is none of
    vLLM's three (unknown fields are ignored, as vLLM's decoders do)."""
    if isinstance(raw, (Stored, Removed, Cleared)):
        return raw
    tag = raw.get("type") if isinstance(raw, dict) else raw[0] if isinstance(raw, (list, tuple)) and raw else None
    if tag == "BlockStored":
        return stored_of(raw)
    if tag == "BlockRemoved":
        _, f = fields(raw, REMOVED_ORDER)
        try:
            return Removed(tuple(map(block_hash, f["block_hashes"])), f.get("medium"), f.get("group_idx"))
        except (KeyError, TypeError) as exc:
            raise EventFormatError(f"BlockRemoved without a valid {exc}") from None
    if tag == "AllBlocksCleared":
        return Cleared()
    raise EventFormatError(f"unknown KV event {tag!r} (BlockStored, BlockRemoved, AllBlocksCleared)")


def parse_events(raws: Iterable[Any]) -> list[Event]:
    return [parse_event(r) for r in raws]


def parse_batch(raw: Any) -> tuple[float, list[Event], int | None]:
    """(ts, events, data_parallel_rank) of a decoded `KVEventBatch`: an array
    as vLLM sends it (a map is accepted too)."""
    if isinstance(raw, dict):
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")]
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise EventFormatError(f"a KVEventBatch is [ts, events, data_parallel_rank], got {type(raw).__name__}")
    rank = raw[2] if len(raw) > 2 else None
    return float(raw[0] or 0.0), parse_events(raw[1]), rank
