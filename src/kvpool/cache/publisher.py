"""Publish the manager's page events in vLLM's KV-event wire format (extra `events`).

Routers that place requests by cached prefix (llm-d's KV cache indexer, NVIDIA
Dynamo's KV router, kvpool's own `kvpool.index`) subscribe to vLLM's ZMQ
stream; `KVEventPublisher` speaks the same protocol, so they can follow a
kvpool cache unchanged:

- a PUB socket sends multipart messages `[topic, seq, payload]`: `seq` is the
  batch's sequence number (8 bytes, big-endian, from 0), `payload` the msgpack
  encoding of a `KVEventBatch` `[ts, events, data_parallel_rank]` (an array
  in both wire formats, as vLLM's `array_like` batch is);
- an optional ROUTER replay socket answers `[b"", start_seq]` (8 bytes,
  big-endian) with `[b"", seq, payload]` for every buffered batch with
  `seq >= start_seq`, then the end marker `[b"", (-1) as 8 signed bytes, b""]`;
- endpoints follow vLLM's rule unless `bind` says otherwise: bind when the
  address holds `*` or `::` or is `ipc://` / `inproc://`, connect otherwise
  (e.g. to a router that binds); `bind=True` binds any address (a loopback
  one for a router that connects, as Dynamo's indexer does).

The events, their fields and the two encodings (`wire="map"`, the default,
named fields as vLLM since PR #42892; `wire="array"`, positional, as before
it) are in `cache/kv_wire.py`; tests/engines_truth/kv_events_runner.py decodes
every batch with vLLM 0.32's (and 0.33's) own classes. What kvpool fills in:
`block_hashes` are kvpool's chained page digests (signed 64-bit ints);
consecutive `stored` events of one group that chain (each parent = the
previous hash) become one `BlockStored` whose `token_ids` are the pages' ids
one after the other (`len(token_ids) == block_size * len(block_hashes)`, for
every kind), consecutive `removed` ones one `BlockRemoved`. `lora_name` and
`extra_keys` carry the request's `ReuseScope` (the LoRA name on every block,
the salt on block 0, as vLLM does); `medium` the tier in the consumer's names
(`media`, vLLM's GPU / CPU / STORAGE by default); `group_idx` the group's
index in the spec, `kv_cache_spec_kind` vLLM's name for its kind and
`kv_cache_spec_sliding_window` its window for sliding groups.

Not thread-safe, no background thread: replay requests are answered inside
`publish` and `serve_replay`, so a long idle publisher should call
`serve_replay` now and then.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import msgspec
import zmq

from kvpool.cache.events import CacheEvent
from kvpool.cache.kv_wire import (
    CLEARED_FIELDS,
    END_SEQ,
    EventPublisherError,
    WireFormat,
    encode_batch,
    encode_struct,
    media_names,
    wire_events,
)
from kvpool.spec.groups import LayerGroup

__all__ = ["END_SEQ", "REPLAYS_PER_PUBLISH", "EventPublisherError", "KVEventPublisher"]

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
    handshake (`wait_connected`). `media`: the medium names of a consumer
    (`kv_wire.MEDIA`: "vllm", the default, or "kvpool") or a mapping from
    kvpool's tiers to names; `bind`: bind or connect the PUB socket (None:
    vLLM's rule, from the address)."""

    def __init__(
        self,
        endpoint: str,
        groups: Sequence[LayerGroup],
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        wire: WireFormat = "map",
        media: str | Mapping[str, str] = "vllm",
        bind: bool | None = None,
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        connect_wait_s: float = 0.0,
    ) -> None:
        _check_options(wire, bind, connect_wait_s, topic)
        self.media = media_names(media)
        for name, value, low in (
            ("buffer_steps", buffer_steps, 1),
            ("hwm", hwm, 0),
            ("data_parallel_rank", data_parallel_rank, 0),
        ):
            if type(value) is not int or value < low:
                raise EventPublisherError(f"{name} must be an integer >= {low}, not {value!r}")
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
            binds = _binds(endpoint) if bind is None else bind
            monitor = connect_wait_s > 0 and not binds
            if monitor:
                self._monitor = self._pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self.endpoint = self._attach(self._pub, endpoint, bind=binds)
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
        return self._send(wire_events(events, self.groups, self.wire, self.media))

    def publish_cleared(self) -> int:
        """Send a batch with one `AllBlocksCleared` (subscribers drop everything
        they know of this publisher): after resetting the cache, or at start."""
        self.serve_replay(limit=REPLAYS_PER_PUBLISH)
        return self._send([encode_struct("AllBlocksCleared", CLEARED_FIELDS, [], self.wire)])

    def _send(self, events: list[Any]) -> int:
        payload = self._encoder.encode(encode_batch(time.time(), events, self.data_parallel_rank))
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


def _check_options(wire: object, bind: object, connect_wait_s: object, topic: object) -> None:
    """EventPublisherError for a wire format, bind rule, wait or topic the publisher cannot use."""
    if wire not in ("map", "array"):
        raise EventPublisherError(f"unknown KV-event wire format {wire!r} (map, array)")
    if bind not in (None, True, False):
        raise EventPublisherError(f"bind must be True, False or None (vLLM's rule), not {bind!r}")
    if not isinstance(connect_wait_s, (int, float)) or not 0 <= connect_wait_s < math.inf:
        raise EventPublisherError(f"connect_wait_s must be a finite number of seconds >= 0, not {connect_wait_s!r}")
    if not isinstance(topic, str):
        raise EventPublisherError(f"topic must be a str, not {type(topic).__name__}")
