"""index: a router's prefix index over many workers' KV events (llm-d's and
Dynamo's indexers, in Python, with each worker's groups and kinds known).

`PrefixIndex(block_size)` takes decoded vLLM events in-process
(`apply(worker, events)`; `kvpool.cache.kv_wire.wire_events` gives them for a
kvpool manager without encoding) and answers `query(token_ids, salt)`: the
tokens each worker can reuse, per tier. `kvpool.index.subscriber` feeds it
from ZMQ streams (extra `events`). See docs/cache.md, "A router's index".
"""

from kvpool.cache.prefix_hit import TierHit
from kvpool.index.events import Cleared, EventFormatError, Removed, Stored, parse_batch, parse_event
from kvpool.index.prefix_index import GroupMeta, PrefixIndex

__all__ = [
    "Cleared",
    "EventFormatError",
    "GroupMeta",
    "PrefixIndex",
    "Removed",
    "Stored",
    "TierHit",
    "parse_batch",
    "parse_event",
]
