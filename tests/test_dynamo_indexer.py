"""Done-when lane: a KV-aware router follows a kvpool cache exactly.

NVIDIA Dynamo 1.6.1's standalone KV indexer (the PyPI wheel's
`python -m dynamo.indexer`, side venv `make dynamo-venv`) subscribes on
loopback to two kvpool workers: the shared scheduler replays 300 turns of
multi-turn conversations on each worker's manager (worker 0 on its GPU pool
alone, worker 1 with a host tier and a disk tier below a small GPU pool),
publishing each step's events. Then, for 200 other prompts, Dynamo's
per-worker answer, per tier (gpu, cpu, disk), equals that manager's own
`cached_prefix`, its log names no batch it could not decode and no block it
refused, and kvpool's own index (`kvpool.index`, on the same streams)
answers the same. Skipped without the side venv, required with
KVPOOL_ENGINES_REQUIRED=1 (as `make test` sets).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from dynamo_helpers import (  # noqa: E402
    DynamoIndexer,
    Turn,
    block_tiers,
    conversations,
    dynamo_python,
    free_port,
    staged,
)
from kvpool.cache import CacheEvent, KVCacheManager, TierSpec  # noqa: E402
from kvpool.cache.prefix_hit import TierHit  # noqa: E402
from kvpool.cache.publisher import KVEventPublisher  # noqa: E402
from kvpool.index import PrefixIndex  # noqa: E402
from kvpool.index.subscriber import IndexSubscriber  # noqa: E402
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits  # noqa: E402
from kvpool.sched import Scheduler, Sequence, session  # noqa: E402
from kvpool.spec import load_model_spec  # noqa: E402

TPB = 16  # Dynamo's --block-size: kvpool's page size
PROBE = list(range(7, 7 + TPB))


def workers() -> list[tuple[KVCacheManager, Scheduler]]:
    """Worker 0: a GPU pool alone; worker 1: a smaller GPU pool over host and disk tiers."""
    spec = load_model_spec("llama-3.1-8b-instruct", tokens_per_block=TPB)
    limits = ServingLimits(max_batch_size=8, max_seq_len=4096, max_num_tokens=512)
    page = spec.groups[0].page_bytes
    out = []
    for pages, tiers in ((700, ()), (260, (TierSpec(Medium.CPU, 160 * page), TierSpec(Medium.DISK, 240 * page)))):
        manager, scheduler, _ = session(PoolPlan.from_pages(spec, {"full": pages}, limits), tiers=tiers)
        out.append((manager, scheduler))
    return out


def subscribed(pub: KVEventPublisher, groups: str, ready: object) -> None:
    """Past ZMQ's slow-joiner gap: a probe block until `ready()` sees it, then a clear."""
    deadline = time.monotonic() + 30
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the subscriber never heard the publisher"
        pub.publish([CacheEvent("stored", groups, 1, None, 0, TPB, token_ids=tuple(PROBE))])
        time.sleep(0.1)
    pub.publish_cleared()


def monotone(tiers: list[str]) -> bool:
    """Every block of a chain at least as warm as the ones after it (each held
    where the next one is, or warmer): Dynamo's per-tier reading is then the
    manager's."""
    rank = [min(("GCD".index(m) for m in t), default=3) for t in tiers]
    return all(a <= b for a, b in zip(rank, rank[1:], strict=False))


def replay(pairs: list[tuple[KVCacheManager, Scheduler]], pubs: list[KVEventPublisher], turns: list[Turn]) -> None:
    """Each turn arrives at its conversation's worker, one per tick; every
    scheduler steps each tick, sampling the turn's own output; each step's
    events are published."""
    outputs: dict[int, tuple[int, ...]] = {}
    queue = list(enumerate(turns))
    while queue or any(s.has_work() for _, s in pairs):
        if queue:
            rid, turn = queue.pop(0)
            outputs[rid] = turn.output
            pairs[turn.conversation % 2][1].add(Sequence(rid, list(turn.prompt), len(turn.output)))
        for (manager, scheduler), pub in zip(pairs, pubs, strict=True):
            step = scheduler.schedule()
            if step is None:
                continue
            sampled = {s.rid: [outputs[s.rid][len(s.output_ids)]] for s, _ in step.decodes}
            for s, start, n in step.prefills:
                if start + n == s.num_tokens:
                    sampled[s.rid] = [outputs[s.rid][0]]
            scheduler.update(step, sampled)
            pub.publish(manager.take_events())


def test_dynamo_and_kvpools_index_follow_two_kvpool_workers_per_tier(tmp_path: Path) -> None:
    dynamo_python()
    pairs = workers()
    ports = [free_port(), free_port()]
    turns, others = conversations(seed=36, requests=300)
    dynamo = DynamoIndexer(ports, TPB, tmp_path / "dynamo-indexer.log")
    index = PrefixIndex(TPB)
    pubs: list[KVEventPublisher] = []
    try:
        with IndexSubscriber(index) as sub:
            for w, ((manager, _), port) in enumerate(zip(pairs, ports, strict=True)):
                pub = KVEventPublisher(f"tcp://127.0.0.1:{port}", manager.groups, bind=True)
                pubs.append(pub)
                sub.add(w, f"tcp://127.0.0.1:{port}", groups=manager.groups)
                group = manager.groups[0].name
                subscribed(pub, group, lambda w=w: dynamo.query(PROBE).get(w, (0,))[0] == TPB)
                subscribed(pub, group, lambda w=w: sub.poll(0) >= 0 and index.query(PROBE)[w].gpu == TPB)
            sub.drain()
            replay(pairs, pubs, turns)
            sub.drain()
            assert all(s["exact"] and not s["undecodable"] for s in sub.status().values())
        want = {w: [m.cached_prefix(p) for p in others] for w, (m, _) in enumerate(pairs)}
        layouts = {w: [block_tiers(m, p) for p in others] for w, (m, _) in enumerate(pairs)}
        dynamos = {w: [TierHit(*staged(t, TPB)) for t in layouts[w]] for w in range(2)}
        deadline = time.monotonic() + 30
        while True:  # the indexer applies its queue a moment after the last batch
            got = {w: [TierHit(*dynamo.query(p).get(w, (0, 0, 0))) for p in others] for w in range(2)}
            if got == dynamos or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        mine = {w: [index.query(p)[w] for p in others] for w in range(2)}
    finally:
        for pub in pubs:
            pub.close()
        dynamo.close()
    for m, _ in pairs:
        m.check_integrity()
    assert not dynamo.refusals(), dynamo.refusals()[:5]
    assert not index.refused
    for w in range(2):
        # Dynamo holds every block kvpool holds, in the same tier: its answers are its reading of them
        diffs = [(i, g, x) for i, (g, x) in enumerate(zip(got[w], dynamos[w], strict=True)) if g != x]
        assert not diffs, f"worker {w}: {len(diffs)} of 200 answers differ, e.g. {diffs[:3]}"
        # and, wherever the chain's blocks are warm to cold, the manager's own per tier answer
        warm_to_cold = [i for i, t in enumerate(layouts[w]) if monotone(t)]
        assert len(warm_to_cold) >= 180
        assert [got[w][i] for i in warm_to_cold] == [want[w][i] for i in warm_to_cold]
        assert mine[w] == want[w]  # kvpool's own index: the manager's answer, every prompt
    # the lane means something: both workers hit, on every tier of worker 1
    assert sum(h.gpu > 0 for h in want[0]) > 50
    assert sum(h.gpu > 0 for h in want[1]) > 20
    assert sum(h.cpu > h.gpu for h in want[1]) > 5 and sum(h.disk > h.cpu for h in want[1]) > 0
