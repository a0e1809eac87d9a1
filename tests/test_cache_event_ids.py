"""Every stored event names its page's token ids, its parent and its salt, so
that a router can key on the tokens (llm-d's and Dynamo's indexers recompute
their own keys from them): on random traffic over hybrid models with state
snapshots, cold tiers and salts, each stored event's ids and parent give back
its digest under kvpool's own hashing, prompt and generated pages alike, in
every tier; the events rebuild exactly what each group and tier holds."""

from __future__ import annotations

from array import array
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, hybrid_spec
from kvpool.cache import CacheEvent, KVCacheManager
from kvpool.cache.events import as_signed
from kvpool.cache.hashing import MASK64, ReuseScope, page_digest, salt_seed
from kvpool.cache.tiers import TierSpec
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits

TPB = 4
SALTS: list[Any] = [None, "tenant-a", ReuseScope("tenant-a", "adapter-1"), ReuseScope(lora="adapter-1"), 7]


def tiered(hybrid: bool, gpu: int, host: int, disk: int) -> KVCacheManager:
    spec = hybrid_spec(tpb=TPB, window=8) if hybrid else full_spec(tpb=TPB)
    pages = {"full": gpu, "sliding": gpu, "linear_state": 6} if hybrid else {"full": gpu}
    plan = PoolPlan.from_pages(spec, pages, ServingLimits(max_batch_size=8, max_seq_len=256))
    per_page = sum(g.slot_bytes for g in spec.groups)
    tiers = [TierSpec(Medium.CPU, host * per_page), TierSpec(Medium.DISK, disk * per_page)] if host else []
    return KVCacheManager(plan, tiers=tiers, state_snapshots=True)


def check_ids(events: list[CacheEvent], tpb: int) -> None:
    for e in events:
        if e.kind != "stored":
            continue
        assert len(e.token_ids) == tpb, e
        parent = salt_seed(e.salt) & MASK64 if e.parent_hash is None else e.parent_hash & MASK64  # type: ignore[arg-type]
        assert as_signed(page_digest(array("q", e.token_ids).tobytes(), parent)) == e.block_hash, e


def held(m: KVCacheManager) -> dict[tuple[str, str], set[int]]:
    out = {(p.name, "GPU"): {as_signed(h) for h in p.cached} for p in m.pools if p.cached}
    if m.tier is not None:
        for level in m.tier.levels():
            for gi, digests in enumerate(level.held):
                if digests:
                    out[(m.groups[gi].name, level.medium)] = {as_signed(h) for h in digests}
    return out


def rebuild(events: list[CacheEvent], into: dict[tuple[str, str], set[int]]) -> None:
    for e in events:
        where = into.setdefault((e.group, e.medium), set())
        if e.kind == "stored":
            where.add(e.block_hash)
        else:
            assert e.block_hash in where, f"removal of a digest never stored: {e}"
            where.discard(e.block_hash)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hybrid=st.booleans(),
    tiers=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_stored_event_names_the_ids_its_digest_covers(hybrid: bool, tiers: bool, seed: int) -> None:
    import random

    rng = random.Random(seed)
    m = tiered(hybrid, gpu=24, host=10 if tiers else 0, disk=10)
    prefixes = [[rng.randrange(100) for _ in range(rng.randrange(4, 20))] for _ in range(3)]
    live: dict[int, int] = {}
    seen: dict[tuple[str, str], set[int]] = {}
    for rid in range(40):
        prompt = rng.choice(prefixes) + [rng.randrange(100) for _ in range(rng.randrange(1, 12))]
        m.create(rid, prompt, salt=rng.choice(SALTS))
        if m.resize(rid, len(prompt) + 1, len(prompt)):
            m.commit(rid, len(prompt))
            live[rid] = len(prompt)
        else:
            m.free(rid)
        for r in list(live):
            h = live[r]
            if rng.random() < 0.3:
                m.free(r)
                del live[r]
            elif m.resize(r, h + 2, h + 1):
                m.commit(r, h + 1, (rng.randrange(100),))
                live[r] = h + 1
        events = m.take_events()
        check_ids(events, TPB)
        rebuild(events, seen)
        assert {k: v for k, v in seen.items() if v} == held(m)
    m.check_integrity()


def test_a_page_offloaded_to_the_host_tier_keeps_its_ids_and_parent() -> None:
    m = tiered(False, gpu=4, host=8, disk=0)
    prompt = list(range(100, 117))  # 4 whole pages and one token
    m.create(1, prompt)
    assert m.resize(1, 16, 16)
    m.commit(1, 16)
    m.free(1)
    first = m.take_events()
    m.create(2, list(range(500, 517)))  # takes all 4 GPU pages: the first prompt's move to the host tier
    assert m.resize(2, 16, 0)
    moved = [e for e in m.take_events() if e.medium == "CPU"]
    assert len(moved) == 4
    by_digest = {e.block_hash: e for e in first}
    for e in moved:
        assert (e.token_ids, e.parent_hash) == (by_digest[e.block_hash].token_ids, by_digest[e.block_hash].parent_hash)
    check_ids(moved, TPB)
