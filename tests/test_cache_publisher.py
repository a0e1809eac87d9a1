# mypy: disable-error-code="call-arg,name-defined,misc"
# (the reference structs are built from msgspec imported through importorskip)
"""KV events in vLLM's wire format: a real ZMQ SUB on loopback decodes every
batch with vLLM's own struct definitions and rebuilds exactly the cached pages
the manager holds; the replay socket returns the same batches."""

# No `from __future__ import annotations`: msgspec must resolve the locally
# defined struct types in `vllm_types` when the classes are created.
import json
import random
import threading
import time
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

from cache_helpers import full_spec, hybrid_spec, manager  # noqa: E402
from kvpool.cache import KVCacheManager  # noqa: E402
from kvpool.cache.events import MASK64  # noqa: E402
from kvpool.cache.publisher import END_SEQ, EventPublisherError, KVEventPublisher  # noqa: E402

TPB = 16


def vllm_types(array_like: bool) -> tuple[Any, Any, Any, Any]:
    """vLLM's structs as vllm/distributed/kv_events.py of the 0.33.0 wheel
    defines them (the batch always `array_like`; events maps, or with
    `array_like=True` arrays, the encoding before vLLM PR #42892). The side
    venv test (test_kv_events_vllm.py) decodes with vLLM's own classes."""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None
        locality: str | None = None
        ownership: str | None = None
        session_id: str | None = None
        lookahead_token_ids: list[list[int]] | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int]
        medium: str | None
        group_idx: int | None = None
        locality: str | None = None
        ownership: str | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

    return KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def run_workload(m: KVCacheManager, pub: KVEventPublisher, seed: int, steps: int = 60) -> None:
    """Requests sharing a few prefixes come, decode a little, commit and leave;
    the pools are small, so cached pages get evicted. One batch per step."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50_000) for _ in range(rng.randrange(20, 90))] for _ in range(4)]
    live: dict[int, int] = {}  # rid -> history
    next_rid = 0
    for _ in range(steps):
        if len(live) < 4 and rng.random() < 0.7:
            tokens = rng.choice(prefixes) + [rng.randrange(50_000) for _ in range(rng.randrange(1, 40))]
            m.create(next_rid, tokens)
            if m.resize(next_rid, len(tokens) + 1, len(tokens)):
                m.commit(next_rid, len(tokens))
                live[next_rid] = len(tokens)
            else:
                m.free(next_rid)
            next_rid += 1
        for rid in list(live):
            h = live[rid]
            if rng.random() < 0.25:
                m.free(rid)
                del live[rid]
            elif m.resize(rid, h + 2, h + 1):
                m.commit(rid, h + 1, [rng.randrange(50_000)])
                live[rid] = h + 1
        pub.publish(m.take_events())
    for rid in list(live)[: len(live) // 2]:
        m.free(rid)
    pub.publish(m.take_events())


def receive(sub: Any, last_seq: int) -> list[tuple[bytes, int, bytes]]:
    got: list[tuple[bytes, int, bytes]] = []
    while not got or got[-1][1] < last_seq:
        assert sub.poll(5000), "no KV-event batch within 5 s"
        topic, seq, payload = sub.recv_multipart()
        got.append((topic, int.from_bytes(seq, "big"), payload))
    return got


def rebuild(payloads: list[bytes], decoder: Any, types: tuple[Any, ...]) -> dict[int, set[int]]:
    _, stored, removed, cleared = types
    held: dict[int, set[int]] = {}
    for payload in payloads:
        for ev in decoder.decode(payload).events:
            if isinstance(ev, cleared):
                held.clear()
            elif isinstance(ev, stored):
                held.setdefault(ev.group_idx, set()).update(ev.block_hashes)
            else:
                assert isinstance(ev, removed)
                group = held.setdefault(ev.group_idx, set())
                assert set(ev.block_hashes) <= group, "removal of a page never stored"
                group.difference_update(ev.block_hashes)
    return {g: s for g, s in held.items() if s}


@pytest.mark.parametrize("wire", ["map", "array"])
@pytest.mark.parametrize("hybrid", [False, True])
def test_subscriber_rebuilds_the_cached_pages(wire: str, hybrid: bool) -> None:
    if hybrid:
        m = manager(hybrid_spec(tpb=TPB, window=40), {"full": 24, "sliding": 12, "linear_state": 10})
    else:
        m = manager(full_spec(tpb=TPB), {"full": 24})
    types = vllm_types(array_like=wire == "array")
    decoder = msgspec.msgpack.Decoder(types[0])
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    try:
        # no `*` in the address: the publisher connects, as vLLM's does
        with KVEventPublisher(
            f"tcp://127.0.0.1:{port}",
            m.groups,
            topic="kv@test",
            replay_endpoint="tcp://127.0.0.1:*",
            wire=wire,  # type: ignore[arg-type]
        ) as pub:
            assert pub.replay_endpoint is not None and pub.replay_endpoint.startswith("tcp://127.0.0.1:")
            while True:  # the slow-joiner gap: clear until the subscriber hears one
                pub.publish_cleared()
                if sub.poll(50):
                    break
            run_workload(m, pub, seed=7 if hybrid else 3)
            got = receive(sub, pub.next_seq - 1)
            assert all(topic == b"kv@test" for topic, _, _ in got)
            assert [s for _, s, _ in got] == list(range(got[0][1], pub.next_seq))
            # vLLM's external hashes: the digests' low 64 bits, unsigned
            expected = {i: {h & MASK64 for h in pool.cached} for i, pool in enumerate(m.pools) if pool.cached}
            assert sum(map(len, expected.values())) > 0
            assert rebuild([p for _, _, p in got], decoder, types) == expected

            # replay from 0 returns every batch (those the SUB missed too), then the end marker
            dealer.connect(pub.replay_endpoint)
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            assert pub.serve_replay(timeout_ms=5000) == 1
            replayed: list[tuple[int, bytes]] = []
            while True:
                assert dealer.poll(5000)
                empty, seq, payload = dealer.recv_multipart()
                assert empty == b""
                if seq == END_SEQ:
                    assert payload == b""
                    break
                replayed.append((int.from_bytes(seq, "big"), payload))
            assert [s for s, _ in replayed] == list(range(pub.next_seq))
            assert replayed[got[0][1] :] == [(s, p) for _, s, p in got]
            assert rebuild([p for _, p in replayed], decoder, types) == expected
    finally:
        sub.close(linger=0)
        dealer.close(linger=0)


def test_wire_fields_follow_vllm() -> None:
    """Field values and raw encoding: one chained store, then its removal."""
    m = manager(hybrid_spec(tpb=TPB, window=40), {"full": 8, "sliding": 8, "linear_state": 4})
    prompt = list(range(100, 148))  # 3 whole pages; the state group snapshots all 48
    m.create(1, prompt)
    assert m.resize(1, 49, 48)
    m.commit(1, 48)
    events = m.take_events()
    for wire in ("map", "array"):
        types = vllm_types(array_like=wire == "array")
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        port = sub.bind_to_random_port("tcp://127.0.0.1")
        try:
            with KVEventPublisher(
                f"tcp://127.0.0.1:{port}",
                m.groups,
                wire=wire,  # type: ignore[arg-type]
                data_parallel_rank=2,
            ) as pub:
                while True:
                    pub.publish_cleared()
                    if sub.poll(50):
                        break
                seq = pub.publish(events)
                assert seq is not None
                ((_, raw_seq, payload),) = receive(sub, seq)[-1:]
        finally:
            sub.close(linger=0)
        raw = msgspec.msgpack.decode(payload)
        assert len(raw) == 3 and raw[2] == 2  # the batch: an array in both encodings
        assert raw[1][0]["type" if wire == "map" else 0] == "BlockStored"
        batch = msgspec.msgpack.Decoder(types[0]).decode(payload)
        assert batch.data_parallel_rank == 2 and abs(batch.ts - time.time()) < 60
        by_group = {e.group_idx: e for e in batch.events}
        full = by_group[0]
        assert full.block_hashes == [e.block_hash & MASK64 for e in events if e.group == "full"]
        assert len(full.block_hashes) == 3 and full.parent_block_hash is None
        assert (full.token_ids, full.block_size, full.medium, full.lora_id) == (prompt, TPB, "GPU", None)
        assert (full.kv_cache_spec_kind, full.kv_cache_spec_sliding_window) == ("full_attention", None)
        assert (full.lora_name, full.extra_keys) == (None, None)
        assert by_group[1].kv_cache_spec_kind == "sliding_window"
        assert by_group[1].kv_cache_spec_sliding_window == 40
        # the snapshot after 3 pages: keyed like page 2, named by page 2's ids
        state = by_group[2]
        assert (state.kv_cache_spec_kind, state.block_size, state.token_ids) == ("mamba", TPB, prompt[32:])
        assert (state.block_hashes, state.parent_block_hash) == (full.block_hashes[2:], full.block_hashes[1])


def test_bad_setup_is_a_typed_error() -> None:
    groups = full_spec().groups
    with pytest.raises(EventPublisherError, match="wire format"):
        KVEventPublisher("tcp://*:0", groups, wire="json")  # type: ignore[arg-type]
    with pytest.raises(EventPublisherError, match="cannot"):
        KVEventPublisher("nonsense://where", groups)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("hwm", -1),
        ("hwm", 1.5),
        ("buffer_steps", 1.5),
        ("buffer_steps", 0),
        ("connect_wait_s", float("nan")),
        ("connect_wait_s", float("inf")),
        ("connect_wait_s", -1.0),
        ("data_parallel_rank", -2),
        ("topic", b"kv"),
    ],
)
def test_bad_options_are_refused_by_name(option: str, value: Any) -> None:
    with pytest.raises(EventPublisherError, match=option):
        KVEventPublisher("tcp://127.0.0.1:0", full_spec().groups, **{option: value})


def test_publish_refuses_what_is_no_cache_event() -> None:
    with KVEventPublisher("tcp://127.0.0.1:*", full_spec().groups) as pub:
        with pytest.raises(EventPublisherError, match="CacheEvent"):
            pub.publish(["not an event"])  # type: ignore[list-item]
        assert pub.next_seq == 0  # nothing sent


def test_a_flood_of_replay_requests_does_not_hold_a_publish_back() -> None:
    # 40 replay requests wait; one publish answers at most REPLAYS_PER_PUBLISH of them, the rest later
    from kvpool.cache.publisher import REPLAYS_PER_PUBLISH

    ctx = zmq.Context.instance()
    with KVEventPublisher("tcp://127.0.0.1:*", full_spec().groups, replay_endpoint="tcp://127.0.0.1:*") as pub:
        assert pub.replay_endpoint is not None
        client = ctx.socket(zmq.DEALER)
        client.connect(pub.replay_endpoint)
        try:
            for _ in range(40):
                client.send_multipart((b"", (0).to_bytes(8, "big")))
            time.sleep(0.5)  # let all 40 arrive
            pub.publish_cleared()
            answered = 0
            while client.poll(100):
                frames = client.recv_multipart()
                answered += frames[-2] == END_SEQ
            assert answered <= REPLAYS_PER_PUBLISH
            rest, deadline = 0, time.time() + 10
            while answered + rest < 40 and time.time() < deadline:  # the rest, on later calls
                rest += pub.serve_replay(timeout_ms=100)
            assert answered + rest == 40
        finally:
            client.close(linger=0)


def frames_during(command: Any) -> list[list[bytes]]:
    """Every message a SUB on a free loopback port receives while
    `command(endpoint)` runs. A bound SUB attaches a peer (and sends it its
    subscription) only when its own thread touches it, so a thread keeps
    reading meanwhile."""
    ready, stop = threading.Event(), threading.Event()
    frames: list[list[bytes]] = []
    port: list[int] = []

    def listen() -> None:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        port.append(sub.bind_to_random_port("tcp://127.0.0.1"))
        ready.set()
        while not stop.is_set() or sub.poll(200):
            if sub.poll(20):
                frames.append(sub.recv_multipart())
        sub.close(linger=0)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(5)
    try:
        command(f"tcp://127.0.0.1:{port[0]}")
    finally:
        stop.set()
        thread.join(10)
    return frames


def check_stream(frames: list[list[bytes]], kinds: set[tuple[int, str]], least: int, array_like: bool = False) -> None:
    """Every batch decodes with vLLM's structs, sequence numbers rise by one,
    the stores name exactly `kinds` (group_idx, kv_cache_spec_kind)."""
    types = vllm_types(array_like=array_like)
    decoder = msgspec.msgpack.Decoder(types[0])
    seqs = [int.from_bytes(seq, "big") for _, seq, _ in frames]
    assert len(seqs) >= least and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    events = [e for _, _, payload in frames for e in decoder.decode(payload).events]
    stored = [e for e in events if isinstance(e, types[1])]
    assert stored and {(e.group_idx, e.kv_cache_spec_kind) for e in stored} == kinds


def test_simulate_publishes_kv_events(cli) -> None:  # type: ignore[no-untyped-def]
    def command(endpoint: str) -> None:
        code, _, err = cli(
            "simulate",
            "qwen3-0.6b",
            "--gpu",
            "h100",
            "--kv-memory",
            "1GiB",
            "--max-seq-len",
            "16384",
            "--max-batch-size",
            "8",
            "--max-num-tokens",
            "2048",
            "--quiet",
            "--trace",
            "mooncake-conv",
            "--max-requests",
            "10",
            "--rate",
            "inf",
            "--kv-events",
            endpoint,
        )
        assert code == 0, err

    check_stream(frames_during(command), {(0, "full_attention")}, least=20)


def test_generate_publishes_kv_events(cli) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")

    def command(endpoint: str) -> None:
        code, _, err = cli(
            "generate",
            "--tiny",
            "llama",
            "--prompt-ids",
            "5,6,7,8,9,10,11,12,13",
            "--prompt-ids",
            "5,6,7,8,9,10,11,12,14",
            "--max-new-tokens",
            "40",
            "--tokens-per-block",
            "4",
            "--kv-events",
            endpoint,
            "--kv-events-wire",
            "array",
        )
        assert code == 0, err

    # decode pages are published the step they fill: 2 x 40 generated tokens fill pages while running
    check_stream(frames_during(command), {(0, "full_attention")}, least=10, array_like=True)


def stored_of(frames: list[list[bytes]]) -> list[Any]:
    """The `BlockStored` events of `frames` (map encoding), decoded with vLLM's structs."""
    batch, stored, _, _ = vllm_types(array_like=False)
    decoder = msgspec.msgpack.Decoder(batch)
    return [e for _, _, payload in frames for e in decoder.decode(payload).events if isinstance(e, stored)]


def test_generate_with_hash_lookahead_names_the_ids_after_each_page(cli) -> None:  # type: ignore[no-untyped-def]
    """`--hash-lookahead 2`: every stored page's event names, as vLLM 0.33 does, the 2 ids that follow
    it in its request (prompt then output, from `--json`), and no page is stored before they exist."""
    pytest.importorskip("torch")
    result: list[tuple[int, str, str]] = []
    prompts = ["5,6,7,8,9,10,11,12,13", "5,6,7,8,9,10,11,12,14"]

    def command(endpoint: str) -> None:
        argv = ["generate", "--tiny", "llama", "--max-new-tokens", "30", "--tokens-per-block", "4", "--json"]
        for p in prompts:
            argv += ["--prompt-ids", p]
        result.append(cli(*argv, "--hash-lookahead", "2", "--kv-events", endpoint))

    stored = stored_of(frames_during(command))
    code, out, err = result[0]
    assert code == 0, err
    seqs = [r["prompt_ids"] + r["output_ids"] for r in json.loads(out)["requests"]]
    blocks = 0
    for e in stored:
        assert e.lookahead_token_ids is not None and len(e.lookahead_token_ids) == len(e.block_hashes)
        for i, after in enumerate(e.lookahead_token_ids):
            page = e.token_ids[i * 4 : (i + 1) * 4]
            assert any(
                s[b : b + 4] == page and s[b + 4 : b + 6] == after and len(after) == 2
                for s in seqs
                for b in range(0, len(s) - 5, 4)
            ), (page, after)
            blocks += 1
    assert blocks >= 10


def test_simulate_with_hash_lookahead_publishes_lookahead_ids(cli) -> None:  # type: ignore[no-untyped-def]
    def command(endpoint: str) -> None:
        argv = ["simulate", "qwen3-0.6b", "--gpu", "h100", "--kv-memory", "1GiB", "--quiet", "--rate", "inf"]
        code, _, err = cli(*argv, "--trace", "mooncake-conv", "--max-requests", "10", "--hash-lookahead", "1",
                           "--kv-events", endpoint)  # fmt: skip
        assert code == 0, err

    stored = stored_of(frames_during(command))
    assert stored and all(
        e.lookahead_token_ids is not None and [len(a) for a in e.lookahead_token_ids] == [1] * len(e.block_hashes)
        for e in stored
    )


def test_kv_events_replay_needs_an_endpoint(cli) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli(
        "simulate",
        "qwen3-0.6b",
        "--gpu",
        "h100",
        "--kv-memory",
        "1GiB",
        "--quiet",
        "--trace",
        "azure-conv",
        "--max-requests",
        "2",
        "--kv-events-replay",
        "tcp://*:0",
    )
    assert code == 2 and "--kv-events-replay needs --kv-events" in err
