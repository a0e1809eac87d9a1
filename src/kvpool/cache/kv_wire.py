"""The wire side of `kvpool.cache.publisher`: vLLM's KV-event structs as msgpack-ready
values (see that module's docstring for the format and the vLLM commit it follows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from kvpool.cache.events import CacheEvent
from kvpool.errors import KvpoolError
from kvpool.spec.groups import LayerGroup

VLLM_COMMIT = "0181ea3173e53eea8cf04a86891488e3dc89bb34"
MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
WireFormat = Literal["map", "array"]

# vLLM's KVCacheSpecKind values (vLLM PR #40984) for kvpool's kinds.
SPEC_KIND = {
    "full": "full_attention",
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
    ),
    7,
)
REMOVED_FIELDS = (("block_hashes", "medium", "group_idx"), 2)
CLEARED_FIELDS: tuple[tuple[str, ...], int] = ((), 0)
BATCH_FIELDS = (("ts", "events", "data_parallel_rank"), 2)


class EventPublisherError(KvpoolError, ValueError):
    """A publisher that cannot be set up (bad endpoint, unknown wire format)."""


def encode_struct(tag: str | None, fields: tuple[tuple[str, ...], int], values: Sequence[Any], wire: WireFormat) -> Any:
    """One msgspec struct as msgspec encodes it with `omit_defaults` (and
    `tag=True` when `tag` is given): a map without default-valued optional
    fields, or (array) a list without the trailing ones."""
    names, required = fields
    if wire == "map":
        out: dict[str, Any] = {} if tag is None else {"type": tag}
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            if i < required or value is not None:
                out[name] = value
        return out
    items = list(values)
    while len(items) > required and items[-1] is None:
        items.pop()
    return items if tag is None else [tag, *items]


def wire_events(events: Sequence[CacheEvent], groups: Sequence[LayerGroup], wire: WireFormat = "map") -> list[Any]:
    """vLLM events (encodable by msgpack) for kvpool events, oldest first; runs
    of chained stores and of removals in one group are merged."""
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
            ):
                hashes.append(events[j].block_hash)
                j += 1
        else:
            while j < n and events[j].kind == "removed" and events[j].group == e.group and events[j].medium == e.medium:
                hashes.append(events[j].block_hash)
                j += 1
        g = groups[index[e.group]]
        if e.kind == "stored":
            window = g.window if g.kind == "sliding" else None
            values = [
                hashes,
                e.parent_hash,
                [],
                e.num_tokens,
                None,
                e.medium,
                None,
                None,
                index[e.group],
                SPEC_KIND.get(g.kind, g.kind),
                window,
            ]
            out.append(encode_struct("BlockStored", STORED_FIELDS, values, wire))
        else:
            out.append(encode_struct("BlockRemoved", REMOVED_FIELDS, [hashes, e.medium, index[e.group]], wire))
        i = j
    return out
