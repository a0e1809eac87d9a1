"""The index's ZMQ subscriber on loopback: it follows a kvpool publisher's
stream, closes a sequence gap from the replay socket (the index then answers
what the manager holds), clears a worker whose gap cannot be closed or whose
publisher restarts, and applies `AllBlocksCleared`."""

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from cache_helpers import full_spec, manager  # noqa: E402
from kvpool.cache import KVCacheManager  # noqa: E402
from kvpool.cache.publisher import EventPublisherError, KVEventPublisher  # noqa: E402
from kvpool.index import PrefixIndex, TierHit  # noqa: E402
from kvpool.index.subscriber import IndexSubscriber  # noqa: E402

TPB = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def publisher(port: int, m: KVCacheManager, **kw: Any) -> KVEventPublisher:
    """A publisher bound to `port` (retried while a closed one still holds it)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return KVEventPublisher(f"tcp://127.0.0.1:{port}", m.groups, bind=True, **kw)
        except EventPublisherError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def requests(
    m: KVCacheManager, pub: KVEventPublisher, rng: random.Random, count: int, prompts: list[list[int]]
) -> None:
    for _ in range(count):
        rid = rng.randrange(1 << 30)
        prompt = rng.choice(prompts) + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        m.create(rid, prompt)
        if m.resize(rid, len(prompt), len(prompt)):
            m.commit(rid, len(prompt))
        m.free(rid)
        pub.publish(m.take_events())


def connected(sub: IndexSubscriber, pub: KVEventPublisher) -> None:
    """Past ZMQ's slow-joiner gap: AllBlocksCleared until one arrives."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.publish_cleared()
        if sub.poll(50):
            return
    raise AssertionError("the subscriber never heard the publisher")


def check(index: PrefixIndex, m: KVCacheManager, prompts: list[list[int]]) -> None:
    for p in prompts:
        assert index.query(p)["w"] == m.cached_prefix(p), p


@pytest.mark.parametrize("replay", [True, False])
def test_a_gap_is_closed_from_the_replay_socket_or_the_worker_is_cleared(replay: bool) -> None:
    rng = random.Random(3)
    m = manager(full_spec(tpb=TPB), {"full": 30})
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(6, 20))] for _ in range(4)]
    port = free_port()
    index = PrefixIndex(TPB)
    with (
        publisher(port, m, replay_endpoint="tcp://127.0.0.1:*" if replay else None) as pub,
        IndexSubscriber(index) as sub,
    ):
        sub.add("w", f"tcp://127.0.0.1:{port}", replay_endpoint=pub.replay_endpoint, groups=m.groups)
        connected(sub, pub)
        requests(m, pub, rng, 10, prompts)
        sub.drain()
        check(index, m, prompts)
        sent = pub._pub.send_multipart
        lost = pub.next_seq

        def drop_one(frames: Any, *args: Any, **kw: Any) -> Any:  # the network loses batch `lost`
            if int.from_bytes(frames[1], "big") != lost:
                return sent(frames, *args, **kw)
            return None

        pub._pub.send_multipart = drop_one  # type: ignore[method-assign,assignment]
        requests(m, pub, rng, 10, prompts)
        # the engine's loop answers replay requests meanwhile (another process, in real life)
        stop = threading.Event()
        server = threading.Thread(target=lambda: [pub.serve_replay(timeout_ms=20) for _ in iter(stop.is_set, True)])
        server.start()
        try:
            sub.drain(quiet_ms=500)
        finally:
            stop.set()
            server.join(5)
        status = sub.status()["w"]
        assert status["gaps"] == 1 and status["last"] == pub.next_seq - 1
        if replay:
            assert status["exact"] and status["replayed"] >= 1 and status["lost"] == 0
            check(index, m, prompts)
        else:  # the state is unknown: forgotten, then only what came after
            assert not status["exact"] and status["lost"] == 1
        pub.publish_cleared()
        sub.drain()
        assert all(index.query(p)["w"] == TierHit(0, 0, 0) for p in prompts)


def test_a_restarted_publisher_clears_the_worker() -> None:
    rng = random.Random(5)
    m = manager(full_spec(tpb=TPB), {"full": 30})
    prompts = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    port = free_port()
    index = PrefixIndex(TPB)
    with IndexSubscriber(index) as sub:
        sub.add("w", f"tcp://127.0.0.1:{port}", groups=m.groups)
        with publisher(port, m) as pub:
            connected(sub, pub)
            requests(m, pub, rng, 6, prompts)
            sub.drain()
            assert any(index.query(p)["w"].gpu for p in prompts)
        fresh = manager(full_spec(tpb=TPB), {"full": 30})  # the engine restarts: a new cache, seq from 0
        with publisher(port, fresh) as pub:
            deadline = time.monotonic() + 10
            while sub.streams["w"].last != 0 and time.monotonic() < deadline:
                pub.next_seq = 0  # every attempt is batch 0 until one arrives
                pub.publish(fresh.take_events() or [])
                pub._send([])
                sub.poll(50)
            assert sub.streams["w"].last == 0 and sub.status()["w"]["exact"]
            check(index, fresh, prompts)
