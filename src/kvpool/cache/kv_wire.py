"""The wire side of `kvpool.cache.publisher`: vLLM's KV-event structs as
msgpack-ready values, built from the manager's `CacheEvent`s.

Follows `vllm/distributed/kv_events.py` of the vLLM 0.32.0 and 0.33.0 wheels
(decoded by those classes in tests/engines_truth/kv_events_runner.py):

- `KVEventBatch(ts, events, data_parallel_rank)` is `array_like`: always an
  array `[ts, events, rank]`, in both encodings;
- events are tagged structs (`omit_defaults`): maps with the tag under
  `"type"` (`wire="map"`, vLLM since PR #42892) or, for consumers of older
  vLLM, arrays `[tag, field, ...]` without the trailing default fields
  (`wire="array"`, vLLM's `array_like=True` before that PR);
- `BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, extra_keys=None, group_idx=None,
  kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None, locality=None,
  ownership=None, session_id=None, lookahead_token_ids=None)` (the last one
  new in 0.33: sent with lookahead digests, `KVCacheManager(hash_lookahead=L)`),
  `BlockRemoved(block_hashes, medium, group_idx=None,
  locality=None, ownership=None)`, `AllBlocksCleared()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from kvpool.cache.events import MASK64, CacheEvent
from kvpool.cache.hashing import published_scope
from kvpool.errors import KvpoolError
from kvpool.spec.groups import LayerGroup

VLLM_VERSIONS = ("0.32.0", "0.33.0")  # the wheels whose kv_events.py this module encodes
END_SEQ = (-1).to_bytes(8, "big", signed=True)
WireFormat = Literal["map", "array"]

# kvpool's tier names -> each consumer's `medium`. vLLM 0.32/0.33 define GPU, CPU and STORAGE
# (`MEDIUM_*` in kv_events.py); Dynamo 1.6.1 reads CPU and CPU_PINNED as its cpu tier, DISK and
# STORAGE as disk; LMCache publishes CPU. "kvpool" keeps kvpool's own names.
MEDIA: dict[str, dict[str, str]] = {
    "vllm": {"GPU": "GPU", "CPU": "CPU", "DISK": "STORAGE"},
    "kvpool": {"GPU": "GPU", "CPU": "CPU", "DISK": "DISK"},
}

# vLLM's KVCacheSpecKind values (vllm/v1/kv_cache_interface.py) for kvpool's kinds. A compressed
# group is vLLM's MLAAttentionSpec with `tokens_per_state` > 1 (DeepSeek-V4's compressed sparse
# attention), hence "mla_attention"; a state group is MambaSpec.
SPEC_KIND = {
    "full": "full_attention",
    "compressed": "mla_attention",
    "sliding": "sliding_window",
    "chunked": "chunked_local_attention",
    "state": "mamba",
}

# (field names, how many are required); the rest default to None.
STORED_FIELDS = (
    (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
        "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window",
        "locality",
        "ownership",
        "session_id",
        "lookahead_token_ids",
    ),
    7,
)
REMOVED_FIELDS = (("block_hashes", "medium", "group_idx", "locality", "ownership"), 2)
CLEARED_FIELDS: tuple[tuple[str, ...], int] = ((), 0)
BATCH_FIELDS = (("ts", "events", "data_parallel_rank"), 2)


class EventPublisherError(KvpoolError, ValueError):
    """A publisher that cannot be set up (bad endpoint, unknown wire format or medium names)."""


def media_names(media: str | Mapping[str, str]) -> dict[str, str]:
    """The medium names of a consumer (`MEDIA`) or an explicit mapping from
    kvpool's tiers (GPU, CPU, DISK) to names; EventPublisherError otherwise."""
    if isinstance(media, str):
        if media not in MEDIA:
            raise EventPublisherError(f"unknown medium names {media!r} (one of {sorted(MEDIA)}, or a mapping)")
        return dict(MEDIA[media])
    names = dict(MEDIA["vllm"])
    for key, value in dict(media).items():
        if key not in names or not isinstance(value, str) or not value:
            raise EventPublisherError(f"medium names map GPU, CPU, DISK to non-empty strings, got {key!r}: {value!r}")
        names[key] = value
    return names


def encode_struct(tag: str | None, fields: tuple[tuple[str, ...], int], values: Sequence[Any], wire: WireFormat) -> Any:
    """One msgspec struct as msgspec encodes it with `omit_defaults` (and
    `tag=True` when `tag` is given): a map without default-valued optional
    fields, or (array) a list without the trailing ones."""
    names, required = fields
    if wire == "map":
        out: dict[str, Any] = {} if tag is None else {"type": tag}
        for i, (name, value) in enumerate(zip(names, values, strict=False)):
            if i < required or value is not None:
                out[name] = value
        return out
    items = list(values)
    while len(items) > required and items[-1] is None:
        items.pop()
    return items if tag is None else [tag, *items]


def encode_batch(ts: float, events: list[Any], data_parallel_rank: int | None) -> list[Any]:
    """`KVEventBatch`: an array in both wire formats (vLLM's `EventBatch` is `array_like`)."""
    return encode_struct(None, BATCH_FIELDS, [ts, events, data_parallel_rank], "array")  # type: ignore[no-any-return]


def extra_keys(lora: str | None, salt: str | None, root: bool, count: int) -> list[tuple[str, ...] | None] | None:
    """vLLM's per-block `extra_keys` of `count` blocks, the first of them
    block 0 of its chain when `root`: the LoRA name on every block, then the
    cache salt on block 0 (`to_event_extra_keys`); None when there are none."""
    if lora is None and (salt is None or not root):
        return None
    keys: list[tuple[str, ...] | None] = [(lora,) if lora is not None else None] * count
    if root and salt is not None:
        keys[0] = (*((lora,) if lora is not None else ()), salt)
    return keys


def wire_events(
    events: Sequence[CacheEvent],
    groups: Sequence[LayerGroup],
    wire: WireFormat = "map",
    media: Mapping[str, str] | None = None,
) -> list[Any]:
    """vLLM events (encodable by msgpack) for kvpool events, oldest first;
    runs of chained stores and of removals in one group and medium are
    merged; hashes are unsigned 64-bit ints, as vLLM sends them
    (`maybe_convert_block_hash`). `media`: kvpool's tier names to the
    consumer's (default vLLM's)."""
    names = MEDIA["vllm"] if media is None else media
    index = {g.name: i for i, g in enumerate(groups)}
    out: list[Any] = []
    i, n = 0, len(events)
    while i < n:
        e = events[i]
        j = i + 1
        hashes = [e.block_hash]
        if e.kind == "stored":
            while (
                j < n
                and events[j].kind == "stored"
                and events[j].group == e.group
                and events[j].num_tokens == e.num_tokens
                and events[j].parent_hash == hashes[-1]
                and events[j].medium == e.medium
                and events[j].salt == e.salt
                and bool(events[j].lookahead) == bool(e.lookahead)
            ):
                hashes.append(events[j].block_hash)
                j += 1
        else:
            while j < n and events[j].kind == "removed" and events[j].group == e.group and events[j].medium == e.medium:
                hashes.append(events[j].block_hash)
                j += 1
        gi = index[e.group]
        medium = names.get(e.medium, e.medium)
        unsigned = [h & MASK64 for h in hashes]  # vLLM's external hashes: unsigned 64-bit ints
        if e.kind == "stored":
            out.append(stored_event(events[i:j], unsigned, gi, groups[gi], medium, wire))
        else:
            out.append(encode_struct("BlockRemoved", REMOVED_FIELDS, [unsigned, medium, gi], wire))
        i = j
    return out


def stored_event(
    run: Sequence[CacheEvent], hashes: list[int], gi: int, group: LayerGroup, medium: str, wire: WireFormat
) -> Any:
    """One `BlockStored` for a chained run of stored events: the pages' token
    ids one after the other, `block_size` one page's (a state snapshot's
    event names its last page, like a page: dense spans for every kind)."""
    first = run[0]
    token_ids = [t for e in run for t in e.token_ids]
    block_size = len(first.token_ids) or first.num_tokens
    salt, lora = published_scope(first.salt)
    values = [
        hashes,
        None if first.parent_hash is None else first.parent_hash & MASK64,
        token_ids,
        block_size,
        None,  # lora_id: deprecated in vLLM, the name is what routers key on
        medium,
        lora,
        extra_keys(lora, salt, first.parent_hash is None, len(hashes)),
        gi,
        SPEC_KIND.get(group.kind, group.kind),
        group.window if group.kind == "sliding" else None,
        None,  # locality
        None,  # ownership
        None,  # session_id
        # vLLM 0.33 (`BlockPool._lookahead_token_ids`): the ids after each block its hash covers
        [list(e.lookahead) for e in run] if first.lookahead else None,
    ]
    return encode_struct("BlockStored", STORED_FIELDS, values, wire)
