"""kvpool's router index (`kvpool.index.PrefixIndex`), fed a manager's events
as a router would read them, answers exactly what the manager's own cache
holds (`KVCacheManager.cached_prefix`), per tier, for hybrid models too: on
random traffic with evictions, cold tiers, state snapshots and salts, with the
groups given or learned from the events, in both wire encodings."""

from __future__ import annotations

import random
from array import array
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, hybrid_spec
from kvpool.cache import KVCacheManager
from kvpool.cache.hashing import ReuseScope, extend_hashes, salt_seed
from kvpool.cache.kv_wire import encode_batch, wire_events
from kvpool.cache.tiers import TierSpec
from kvpool.index import PrefixIndex, TierHit, parse_batch
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits

TPB = 4
SALTS: list[Any] = [None, "tenant-a", ReuseScope("tenant-a", "adapter-1"), 7]


def make(hybrid: bool, tiers: bool, seed: int, ahead: int = 0) -> KVCacheManager:
    spec = hybrid_spec(tpb=TPB, window=8) if hybrid else full_spec(tpb=TPB)
    gpu = 16 + seed % 16
    pages = {"full": gpu, "sliding": gpu, "linear_state": 6} if hybrid else {"full": gpu}
    plan = PoolPlan.from_pages(spec, pages, ServingLimits(max_batch_size=8, max_seq_len=256))
    per_page = sum(g.slot_bytes for g in spec.groups)
    cold = [TierSpec(Medium.CPU, 8 * per_page), TierSpec(Medium.DISK, 8 * per_page)] if tiers else []
    return KVCacheManager(plan, tiers=cold, state_snapshots=True, hash_lookahead=ahead)


def traffic(m: KVCacheManager, rng: random.Random, prefixes: list[list[int]], steps: int, feed: Any) -> None:
    """Requests that share prefixes come, decode, leave; `feed()` after each step."""
    live: dict[int, int] = {}
    for rid in range(steps):
        prompt = rng.choice(prefixes) + [rng.randrange(60) for _ in range(rng.randrange(1, 10))]
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
                m.commit(r, h + 1, (rng.randrange(60),))
                live[r] = h + 1
        feed()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hybrid=st.booleans(),
    tiers=st.booleans(),
    learned=st.booleans(),
    wire=st.sampled_from(["map", "array"]),
    seed=st.integers(0, 2**16),
    ahead=st.sampled_from([0, 0, 1, 2, 5]),
)
def test_the_index_answers_what_the_manager_holds(
    hybrid: bool, tiers: bool, learned: bool, wire: str, seed: int, ahead: int
) -> None:
    """`ahead`: the manager's lookahead digests (`hash_lookahead`), which its events name per block."""
    rng = random.Random(seed)
    m = make(hybrid, tiers, seed, ahead)
    # with lookahead digests kvpool takes no state snapshot (the history would have to end on the page whose
    # digest waits for L more ids), so a state group stores nothing to learn it from: give the groups then
    learned = learned and not (hybrid and ahead)
    index = PrefixIndex(TPB)
    index.add_worker("w", None if learned else m.groups)
    encoder = msgspec.msgpack.Encoder()

    def feed() -> None:  # as a subscriber reads them: encoded, decoded, parsed
        events = wire_events(m.take_events(), m.groups, wire)  # type: ignore[arg-type]
        _, decoded, _ = parse_batch(msgspec.msgpack.decode(encoder.encode(encode_batch(0.0, events, 0))))
        index.apply("w", decoded)

    prefixes = [[rng.randrange(60) for _ in range(rng.randrange(4, 24))] for _ in range(3)]
    traffic(m, rng, prefixes, 30, feed)
    assert not index.refused
    for _ in range(30):
        query = rng.choice(prefixes) + [rng.randrange(60) for _ in range(rng.randrange(0, 12))]
        salt = rng.choice(SALTS)
        assert index.query(query, salt)["w"] == m.cached_prefix(query, salt), (query, salt)
    # what a router reads as the worker's cache size: the pages every GPU pool holds by digest
    assert index.gpu_blocks("w") == sum(len(pool.cached) for pool in m.pools)
    assert index.gpu_blocks("nobody") == 0
    m.check_integrity()


def test_a_hybrid_worker_is_answered_by_its_real_reuse_not_its_full_groups() -> None:
    # the full group still holds the whole prompt; the sliding window's pages are gone
    spec = hybrid_spec(tpb=TPB, window=8)
    plan = PoolPlan.from_pages(spec, {"full": 60, "sliding": 12, "linear_state": 6}, ServingLimits(max_seq_len=256))
    m = KVCacheManager(plan, state_snapshots=True)
    index = PrefixIndex(TPB)
    prompt = list(range(100, 124))  # 6 pages
    m.create(1, prompt)
    assert m.resize(1, 24, 24)
    m.commit(1, 24)
    m.free(1)
    index.apply("w", wire_events(m.take_events(), m.groups))
    assert index.query(prompt)["w"] == m.cached_prefix(prompt) == TierHit(24, 24, 24)
    m.create(2, list(range(500, 548)))  # 12 pages: the whole sliding pool, a fifth of the full one
    assert m.resize(2, 48, 0)
    index.apply("w", wire_events(m.take_events(), m.groups))
    digests: list[int] = []
    extend_hashes(digests, array("q", prompt), TPB, salt_seed(None), 6)
    full, sliding = m.pools[0], m.pools[1]
    assert all(d in full.cached for d in digests) and not any(d in sliding.cached for d in digests)
    # a router keyed on the full group alone would answer 24 tokens; the reuse is none
    assert index.query(prompt)["w"] == m.cached_prefix(prompt) == TierHit(0, 0, 0)


def test_refused_stores_are_counted_by_reason() -> None:
    index = PrefixIndex(TPB)
    store = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2, 3, 4]}
    index.apply("w", [{**store, "block_size": 8}])  # another block size
    index.apply("w", [{**store, "block_size": TPB, "token_ids": []}])  # not dense (what kvpool sent before)
    index.apply("w", [{**store, "block_size": TPB, "parent_block_hash": 99}])  # an unknown parent
    index.apply("w", [{**store, "block_size": TPB, "medium": "TAPE"}])
    assert dict(index.refused) == {"block_size": 1, "sparse": 1, "orphan": 1, "medium": 1}
    assert index.query([1, 2, 3, 4])["w"] == TierHit(0, 0, 0)
    index.apply("w", [{**store, "block_size": TPB}])
    assert index.query([1, 2, 3, 4, 5])["w"] == TierHit(4, 4, 4)
    index.apply("w", [["AllBlocksCleared"]])
    assert index.query([1, 2, 3, 4])["w"] == TierHit(0, 0, 0)


def test_a_lookahead_store_counts_only_where_the_prompt_goes_on_with_its_ids() -> None:
    store = {"type": "BlockStored", "block_size": TPB, "parent_block_hash": None}
    index = PrefixIndex(TPB)
    index.apply(
        "w", [{**store, "block_hashes": [1, 2], "token_ids": list(range(8)), "lookahead_token_ids": [[4], [8]]}]
    )
    assert index.query(list(range(9)))["w"].gpu == 8
    assert index.query(list(range(8)))["w"].gpu == 4  # block 1's next id is not in the prompt
    assert index.query([*range(8), 99])["w"].gpu == 4  # another next id: another block
    assert index.query([0, 1, 2, 3, 99])["w"].gpu == 0
    # a worker without lookahead hashes, beside it: keyed on the ids alone
    index.apply("v", [{**store, "block_hashes": [7], "token_ids": [0, 1, 2, 3]}])
    assert index.query([0, 1, 2, 3])["v"].gpu == 4 and index.query([0, 1, 2, 3])["w"].gpu == 0


def test_lookahead_ids_that_are_not_l_per_block_are_refused() -> None:
    store = {"type": "BlockStored", "block_size": TPB, "parent_block_hash": None, "token_ids": list(range(8))}
    index = PrefixIndex(TPB)
    index.apply("w", [{**store, "block_hashes": [1, 2], "lookahead_token_ids": [[4]]}])  # one list for two blocks
    index.apply("w", [{**store, "block_hashes": [1, 2], "lookahead_token_ids": [[4], [8, 9]]}])  # ragged
    index.apply("w", [{**store, "block_hashes": [1, 2], "lookahead_token_ids": [[], []]}])
    index.apply("w", [{**store, "block_hashes": [1, 2], "lookahead_token_ids": [[4, 5], [8, 9]]}])  # L = 2
    index.apply("w", [{**store, "block_hashes": [3, 4], "lookahead_token_ids": [[4], [8]]}])  # not the worker's L
    index.apply("w", [{**store, "block_hashes": [5, 6]}])  # none: not the worker's L either
    assert dict(index.refused) == {"lookahead": 5}
    assert index.query([*range(8), 8, 9])["w"].gpu == 8
    index.apply("w", [["AllBlocksCleared"]])  # a restart may change L
    index.apply("w", [{**store, "block_hashes": [5, 6]}])
    assert index.query(list(range(8)))["w"].gpu == 8 and index.refused["lookahead"] == 5


def test_a_copy_of_a_block_keeps_it_until_its_own_removal() -> None:
    # vLLM caches a block that fills again with a hash it holds (its BlockHashToBlockMap keeps both) and
    # removes each copy with its own BlockRemoved
    store = {"type": "BlockStored", "block_size": TPB, "parent_block_hash": None, "token_ids": [1, 2, 3, 4]}
    index = PrefixIndex(TPB)
    index.apply("w", [{**store, "block_hashes": [9]}, {**store, "block_hashes": [9]}])
    assert index.gpu_blocks("w") == 1
    index.apply("w", [{"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU"}])
    assert index.query([1, 2, 3, 4])["w"].gpu == 4
    index.apply("w", [{"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU"}])
    assert index.query([1, 2, 3, 4])["w"].gpu == 0 and index.gpu_blocks("w") == 0
    assert not index.workers["w"].copies


@pytest.mark.parametrize("bad", [{"type": "Nope"}, ["BlockStored"], 3, {"block_hashes": []}])
def test_what_is_no_vllm_event_is_a_typed_error(bad: Any) -> None:
    from kvpool.index import EventFormatError

    with pytest.raises(EventFormatError):
        PrefixIndex(TPB).apply("w", [bad])
