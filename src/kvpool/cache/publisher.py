"""Publish the manager's page events in vLLM's KV-event wire format (extra `events`).

Routers that place requests by cached prefix (llm-d's KV cache indexer, NVIDIA
Dynamo's KV router) subscribe to vLLM's ZMQ stream; `KVEventPublisher` speaks
the same protocol, so they can follow a kvpool cache unchanged:

- a PUB socket sends multipart messages `[topic, seq, payload]`: `seq` is the
  batch's sequence number (8 bytes, big-endian, from 0), `payload` the msgpack
  encoding of a `KVEventBatch` (`ts` float seconds, `events`,
  `data_parallel_rank`);
- an optional ROUTER replay socket answers `[b"", start_seq]` (8 bytes,
  big-endian) with `[b"", seq, payload]` for every buffered batch with
  `seq >= start_seq`, then the end marker `[b"", (-1) as 8 signed bytes, b""]`;
- endpoints follow vLLM's rule: bind when the address holds `*` or `::` or is
  `ipc://` / `inproc://`, connect otherwise (e.g. to a router that binds).

Events (msgspec tagged structs, tag = class name, `omit_defaults`), fields in
vLLM's order: `BlockStored(block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name, extra_keys=None, group_idx=None,
kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None)`,
`BlockRemoved(block_hashes, medium, group_idx=None)`, `AllBlocksCleared()`.

Matches `vllm/distributed/kv_events.py` at vLLM commit
0181ea3173e53eea8cf04a86891488e3dc89bb34 (after vLLM PR #42892, merged
2026-06-09, which dropped `array_like`): `wire="map"` (the default) encodes
structs as maps, each event with its tag under `"type"`. `wire="array"` is the
positional encoding vLLM used before that PR (`array_like=True`: a batch is
`[ts, events, data_parallel_rank]`, an event `["BlockStored", block_hashes, ...]`
with trailing default fields left off) for consumers that still expect it.

What kvpool fills in: `block_hashes` are kvpool's chained page hashes (signed
64-bit ints); consecutive `stored` events of one group that chain (each
parent = the previous hash) and have the same token count become one
`BlockStored`, consecutive `removed` ones of one group one `BlockRemoved`.
`token_ids` is always `[]`: a `CacheEvent` does not carry token ids (routers
that rebuild hashes from tokens cannot use this stream; those that index by
hash can). `block_size` is the event's `num_tokens` (a state snapshot's: the whole
prefix it covers); `lora_id`/`lora_name`
None (a LoRA goes into kvpool's salt, hence into the hashes); `medium` "GPU";
`group_idx` the group's index in the spec, `kv_cache_spec_kind` vLLM's name for
its kind (kvpool's own name where vLLM has none) and
`kv_cache_spec_sliding_window` its window for sliding groups.

Not thread-safe, no background thread: replay requests are answered inside
`publish` and `serve_replay`, so a long idle publisher should call
`serve_replay` now and then.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import msgspec
import zmq

from kvpool.cache.events import CacheEvent
from kvpool.cache.kv_wire import (
    BATCH_FIELDS as BATCH_FIELDS,
)
from kvpool.cache.kv_wire import (
    CLEARED_FIELDS as CLEARED_FIELDS,
)
from kvpool.cache.kv_wire import (
    END_SEQ as END_SEQ,
)
from kvpool.cache.kv_wire import (
    MEDIUM_GPU as MEDIUM_GPU,
)
from kvpool.cache.kv_wire import (
    REMOVED_FIELDS as REMOVED_FIELDS,
)
from kvpool.cache.kv_wire import (
    SPEC_KIND as SPEC_KIND,
)
from kvpool.cache.kv_wire import (
    STORED_FIELDS as STORED_FIELDS,
)
from kvpool.cache.kv_wire import (  # re-exported: the publisher's public surface
    VLLM_COMMIT as VLLM_COMMIT,
)
from kvpool.cache.kv_wire import (
    EventPublisherError as EventPublisherError,
)
from kvpool.cache.kv_wire import (
    WireFormat as WireFormat,
)
from kvpool.cache.kv_wire import (
    encode_struct as encode_struct,
)
from kvpool.cache.kv_wire import (
    wire_events as wire_events,
)
from kvpool.spec.groups import LayerGroup

# replay requests answered per `publish`: each resends the whole buffer, so a flood of them must
# not hold a step's events back; the rest wait for the next calls (or `serve_replay()`)
REPLAYS_PER_PUBLISH = 4


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://") or endpoint.startswith("inproc://")


class KVEventPublisher:
    """vLLM-compatible KV-event stream of one kvpool manager (see the module
    docstring for the protocol). `groups` are the manager's (`manager.groups`),
    for `group_idx` and the kind fields; `buffer_steps` batches are kept for
    replay. Use `publish(manager.take_events())` once per engine step. A
    publisher that connects waits up to `connect_wait_s` for the peer's
    handshake (`wait_connected`)."""

    def __init__(
        self,
        endpoint: str,
        groups: Sequence[LayerGroup],
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        wire: WireFormat = "map",
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        connect_wait_s: float = 0.0,
    ) -> None:
        if wire not in ("map", "array"):
            raise EventPublisherError(f"unknown KV-event wire format {wire!r} (map, array)")
        for name, value, low in (
            ("buffer_steps", buffer_steps, 1),
            ("hwm", hwm, 0),
            ("data_parallel_rank", data_parallel_rank, 0),
        ):
            if type(value) is not int or value < low:
                raise EventPublisherError(f"{name} must be an integer >= {low}, not {value!r}")
        if not isinstance(connect_wait_s, (int, float)) or not 0 <= connect_wait_s < math.inf:
            raise EventPublisherError(f"connect_wait_s must be a finite number of seconds >= 0, not {connect_wait_s!r}")
        if not isinstance(topic, str):
            raise EventPublisherError(f"topic must be a str, not {type(topic).__name__}")
        self.groups = list(groups)
        self.wire: WireFormat = wire
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.next_seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        try:
            self._pub.setsockopt(zmq.LINGER, 100)  # never block the exit on a lost peer
            self._pub.set_hwm(hwm)
            monitor = connect_wait_s > 0 and not _binds(endpoint)
            if monitor:
                self._monitor = self._pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self.endpoint = self._attach(self._pub, endpoint, bind=_binds(endpoint))
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 100)
                self.replay_endpoint: str | None = self._attach(self._replay, replay_endpoint, bind=True)
            else:
                self.replay_endpoint = None
        except EventPublisherError:
            self.close()
            raise
        if monitor:
            self.wait_connected(connect_wait_s)

    @staticmethod
    def _attach(sock: zmq.Socket[bytes], endpoint: str, *, bind: bool) -> str:
        try:
            if bind:
                sock.bind(endpoint)
                return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            sock.connect(endpoint)
            return endpoint
        except zmq.ZMQError as exc:
            raise EventPublisherError(f"KV events: cannot {'bind' if bind else 'connect'} {endpoint!r}: {exc}") from exc

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait until the PUB socket's peer completes its handshake (at most
        `timeout_s`, then 50 ms for its subscription), so a short run does not lose its first batches to the ZMQ
        slow-joiner gap; True if it did. Only once, for a publisher made with
        `connect_wait_s > 0` (the monitor is attached before connecting)."""
        if self._monitor is None:
            return False
        try:
            if not self._monitor.poll(max(0, int(timeout_s * 1000))):
                return False
            time.sleep(0.05)  # the subscription follows the handshake
            return True
        finally:
            self._pub.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def publish(self, events: Sequence[CacheEvent]) -> int | None:
        """Send one batch holding `events` (nothing when there are none); its
        sequence number, or None. Answers pending replay requests first."""
        self.serve_replay(limit=REPLAYS_PER_PUBLISH)
        if not events:
            return None
        bad = next((e for e in events if not isinstance(e, CacheEvent)), None)
        if bad is not None:
            raise EventPublisherError(f"publish takes CacheEvents (manager.take_events()), got {type(bad).__name__}")
        return self._send(wire_events(events, self.groups, self.wire))

    def publish_cleared(self) -> int:
        """Send a batch with one `AllBlocksCleared` (subscribers drop everything
        they know of this publisher): after resetting the cache, or at start."""
        self.serve_replay(limit=REPLAYS_PER_PUBLISH)
        return self._send([encode_struct("AllBlocksCleared", CLEARED_FIELDS, [], self.wire)])

    def _send(self, events: list[Any]) -> int:
        batch = encode_struct(None, BATCH_FIELDS, [time.time(), events, self.data_parallel_rank], self.wire)
        payload = self._encoder.encode(batch)
        seq = self.next_seq
        self.next_seq += 1
        self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        return seq

    def serve_replay(self, timeout_ms: int = 0, limit: int | None = None) -> int:
        """Answer the replay requests waiting (waiting up to `timeout_ms` for the
        first), at most `limit` of them (None: all); how many were answered.
        Malformed requests are ignored."""
        if self._replay is None:
            return 0
        answered = 0
        while (limit is None or answered < limit) and self._replay.poll(timeout_ms if answered == 0 else 0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in self._buffer:
                if seq >= first:
                    self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            self._replay.send_multipart((client, b"", END_SEQ, b""))
            answered += 1
        return answered

    def close(self) -> None:
        """Close the sockets (pending messages are dropped after 100 ms)."""
        self._pub.close(linger=100)
        if self._replay is not None:
            self._replay.close(linger=100)

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
