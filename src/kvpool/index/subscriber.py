"""`IndexSubscriber`: feed a `PrefixIndex` from workers' KV-event streams over
ZMQ, vLLM's protocol (`kvpool.cache.publisher` speaks it too; extra `events`).

Per worker one SUB socket reads `[topic, seq, payload]` messages (`seq` 8
bytes big-endian, `payload` a msgpack `KVEventBatch`). Batches are applied in
sequence order:

- a **gap** (a batch after `last + 1`) is closed from the worker's replay
  socket (a DEALER sends `[b"", last + 1]`, the ROUTER answers every buffered
  batch from there, then seq -1); a gap the replay cannot close (no replay
  socket, or its buffer no longer reaches back) leaves the worker's state
  unknown: the index forgets it (`clear`) and marks it not `exact`, then goes
  on with the batches that come;
- a **restart** (a batch numbered 0 after others) clears the worker first;
- `AllBlocksCleared` is applied like any event (the index forgets the worker);
- a batch that does not decode is counted in `undecodable` and treated as a gap.

Not thread-safe and no thread of its own: call `poll(timeout_ms)` (or
`drain`) from the router's loop.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import msgspec
import zmq

from kvpool.errors import KvpoolError
from kvpool.index.events import EventFormatError, parse_batch
from kvpool.index.prefix_index import PrefixIndex
from kvpool.spec.groups import LayerGroup

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class SubscriberError(KvpoolError, ValueError):
    """A worker that cannot be subscribed to (bad endpoint, duplicate id)."""


@dataclass
class WorkerStream:
    """One worker's stream: its sockets and what was applied."""

    sub: zmq.Socket[bytes]
    replay: str | None
    last: int | None = None
    exact: bool = True  # every batch since the first (or the last restart) was applied
    batches: int = 0
    replayed: int = 0
    gaps: int = 0
    lost: int = 0  # gaps the replay could not close
    undecodable: int = 0
    errors: list[str] = field(default_factory=list)


class IndexSubscriber:
    """Subscribes `index` to workers' ZMQ KV-event streams (see the module docstring)."""

    def __init__(self, index: PrefixIndex, *, replay_timeout_ms: int = 2000) -> None:
        self.index = index
        self.replay_timeout_ms = replay_timeout_ms
        self.streams: dict[Hashable, WorkerStream] = {}
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._poller = zmq.Poller()
        self._by_socket: dict[zmq.Socket[bytes], Hashable] = {}
        self._decoder = msgspec.msgpack.Decoder()

    def add(
        self,
        worker: Hashable,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        bind: bool = False,
        groups: list[LayerGroup] | tuple[LayerGroup, ...] | None = None,
    ) -> None:
        """Subscribe to `worker`'s PUB `endpoint` (connect, or `bind` for
        publishers that connect); `replay_endpoint`: its ROUTER for gaps;
        `groups`: its groups when known (`PrefixIndex.add_worker`)."""
        if worker in self.streams:
            raise SubscriberError(f"worker {worker!r} is subscribed already")
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        try:
            sub.bind(endpoint) if bind else sub.connect(endpoint)
        except zmq.ZMQError as exc:
            sub.close()
            raise SubscriberError(
                f"worker {worker!r}: cannot {'bind' if bind else 'connect'} {endpoint!r}: {exc}"
            ) from exc
        self.index.add_worker(worker, groups)
        self.streams[worker] = WorkerStream(sub, replay_endpoint)
        self._poller.register(sub, zmq.POLLIN)
        self._by_socket[sub] = worker

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply the batches waiting (waiting up to `timeout_ms` for the
        first); how many were applied."""
        applied = 0
        ready = dict(self._poller.poll(timeout_ms))
        while ready:
            for sock in ready:
                worker = self._by_socket[sock]
                while sock.poll(0):
                    applied += self._receive(worker, sock.recv_multipart())
            ready = dict(self._poller.poll(0))
        return applied

    def drain(self, quiet_ms: int = 200, timeout_s: float = 30.0) -> int:
        """Poll until no batch came for `quiet_ms` (at most `timeout_s`)."""
        import time

        applied, deadline = 0, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            n = self.poll(quiet_ms)
            applied += n
            if n == 0:
                break
        return applied

    def _receive(self, worker: Hashable, frames: list[bytes]) -> int:
        stream = self.streams[worker]
        if len(frames) != 3 or len(frames[1]) != 8:
            stream.undecodable += 1
            return 0
        seq = int.from_bytes(frames[1], "big", signed=True)
        if stream.last is not None:
            if seq == 0 and stream.last >= 0:  # the publisher restarted
                self.index.clear(worker)
                stream.exact, stream.last = True, None
            elif seq <= stream.last:  # a batch applied already (a replay overlapping the live stream)
                return 0
            elif seq > stream.last + 1:
                stream.gaps += 1
                self._close_gap(worker, stream, seq)
        return self._apply(worker, stream, seq, frames[2])

    def _apply(self, worker: Hashable, stream: WorkerStream, seq: int, payload: bytes) -> int:
        try:
            _, events, _ = parse_batch(self._decoder.decode(payload))
        except (msgspec.DecodeError, EventFormatError) as exc:
            stream.undecodable += 1
            stream.errors.append(f"batch {seq}: {exc}")
            self.index.clear(worker)  # what it said is lost: the worker's state is unknown
            stream.exact = False
            stream.last = seq
            return 0
        self.index.apply(worker, events)
        stream.last = seq
        stream.batches += 1
        return 1

    def _close_gap(self, worker: Hashable, stream: WorkerStream, upto: int) -> None:
        """Apply batches `last + 1`..`upto - 1` from the replay socket; clear the
        worker when they cannot all be had."""
        assert stream.last is not None
        first = stream.last + 1
        got = self._replay(stream, first) if stream.replay is not None else []
        wanted = [(s, p) for s, p in got if first <= s < upto]
        if [s for s, _ in wanted] != list(range(first, upto)):
            stream.lost += 1
            self.index.clear(worker)
            stream.exact = False
            return
        for seq, payload in wanted:
            stream.replayed += 1
            self._apply(worker, stream, seq, payload)

    def _replay(self, stream: WorkerStream, start: int) -> list[tuple[int, bytes]]:
        assert stream.replay is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes]] = []
        try:
            dealer.connect(stream.replay)
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while dealer.poll(self.replay_timeout_ms):
                frames = dealer.recv_multipart()
                if len(frames) != 3 or frames[1] == END_SEQ:
                    break
                out.append((int.from_bytes(frames[1], "big"), frames[2]))
        finally:
            dealer.close()
        return out

    def close(self) -> None:
        for stream in self.streams.values():
            stream.sub.close(linger=0)
        self.streams.clear()
        self._by_socket.clear()

    def __enter__(self) -> IndexSubscriber:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def status(self) -> dict[Hashable, dict[str, Any]]:
        """Per worker: last sequence applied, exact, and the counters."""
        return {
            w: {
                "last": s.last,
                "exact": s.exact,
                "batches": s.batches,
                "replayed": s.replayed,
                "gaps": s.gaps,
                "lost": s.lost,
                "undecodable": s.undecodable,
            }
            for w, s in self.streams.items()
        }
