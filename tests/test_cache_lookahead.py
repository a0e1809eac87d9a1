"""Lookahead page digests (`KVCacheManager(hash_lookahead=L)`), as vLLM 0.33 hashes
blocks when an EAGLE-family drafter reads ahead (`num_hash_lookahead_tokens`,
`get_request_block_hasher`): a page's digest also covers the L token ids after
it, so a page is stored, reused and published only once those ids are known,
and its event carries them (`lookahead_token_ids`). vLLM's own hasher and
decoder agree in tests/test_kv_events_vllm.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec
from kvpool.cache import CacheUsageError, KVCacheManager
from kvpool.cache.kv_wire import wire_events
from kvpool.plan import PoolPlan, ServingLimits

TPB = 16


def lookahead_manager(ahead: int, pages: int = 64) -> KVCacheManager:
    plan = PoolPlan.from_pages(full_spec(TPB), {"full": pages}, ServingLimits(max_seq_len=4096))
    return KVCacheManager(plan, hash_lookahead=ahead)


def test_a_page_is_stored_once_the_ids_after_it_are_known() -> None:
    m = lookahead_manager(2)
    prompt = list(range(100, 100 + 2 * TPB + 1))  # two pages and one id: page 1 lacks its second lookahead id
    m.create(0, prompt)
    assert m.resize(0, len(prompt) + 4, len(prompt))
    m.commit(0, len(prompt))
    first = [e for e in m.take_events() if e.kind == "stored"]
    assert [e.token_ids for e in first] == [tuple(prompt[:TPB])]
    assert first[0].lookahead == tuple(prompt[TPB : TPB + 2])
    assert m.resize(0, len(prompt) + 4, len(prompt) + 1)
    m.commit(0, len(prompt) + 1, (7,))  # the generated id completes page 1's lookahead
    second = [e for e in m.take_events() if e.kind == "stored"]
    assert [e.lookahead for e in second] == [(prompt[-1], 7)]
    (event,) = [e for e in wire_events(first + second, m.groups) if e["type"] == "BlockStored"]
    assert event["lookahead_token_ids"] == [prompt[TPB : TPB + 2], [prompt[-1], 7]]


def test_a_page_followed_by_other_ids_is_not_reused() -> None:
    # the drafter's KV at a page's last position depends on the id after it: same page, other next id, no hit
    m = lookahead_manager(1)
    a = list(range(1, 2 * TPB + 2))
    m.create(0, a)
    assert m.resize(0, len(a), len(a))
    m.commit(0, len(a))
    m.free(0)
    same = a[: TPB + 1] + [999] * TPB
    other = a[:TPB] + [999] * (TPB + 1)
    assert m.create(1, same) == TPB
    assert m.create(2, other) == 0
    assert lookahead_manager(0).hash_lookahead == 0


def test_hash_lookahead_must_be_a_positive_int() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(CacheUsageError, match="hash_lookahead"):
            lookahead_manager(bad)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(ahead=st.integers(1, 20), prompt=st.integers(1, 200), decode=st.integers(0, 40))
def test_stored_pages_are_the_whole_pages_whose_lookahead_is_known(ahead: int, prompt: int, decode: int) -> None:
    m = lookahead_manager(ahead, pages=32)
    ids = list(range(1, prompt + 1))
    m.create(0, ids)
    total = prompt + decode
    assert m.resize(0, total, prompt)
    m.commit(0, prompt)
    for n in range(prompt + 1, total + 1):
        assert m.resize(0, total, n)
        m.commit(0, n, (n,))
    stored = [e for e in m.take_events() if e.kind == "stored"]
    assert len(stored) == max(0, (total - ahead) // TPB)
    known = ids + list(range(prompt + 1, total + 1))
    for i, e in enumerate(stored):
        assert e.token_ids == tuple(known[i * TPB : (i + 1) * TPB])
        assert e.lookahead == tuple(known[(i + 1) * TPB : (i + 1) * TPB + ahead])


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_can_create_answers_what_create_reuses(ahead: int) -> None:
    """Asked before `create`, the manager names the hit `create` then attaches,
    with and without lookahead digests (which the prompt memo never reuses)."""
    m = lookahead_manager(ahead)
    first = list(range(100, 100 + 4 * 6))
    m.create(1, first)
    assert m.resize(1, len(first), len(first))
    m.commit(1, len(first), [])
    for rid, prompt in enumerate([first + [7, 8, 9], first[:13], list(range(500, 520)), first + [7]], start=2):
        asked = m.can_create(prompt)
        assert asked and asked.hit == m.create(rid, prompt)
        m.free(rid)
