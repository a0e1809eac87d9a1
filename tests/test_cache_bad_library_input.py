"""Bad input to the cache layer's library calls: a typed error (or a falsy
result) and nothing changed, however large the input says the work is."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cache_helpers import assert_unchanged, full_spec, manager, snapshot, twin_spec
from kvpool.cache import CacheUsageError, KVCacheManager


def admitted() -> KVCacheManager:
    m = manager(twin_spec(tpb=4, window=8), {"full": 64, "sliding": 64})
    for rid in (1, 2):
        m.create(rid, list(range(10 * rid, 10 * rid + 9)))
        assert m.resize(rid, 10, 9)
    return m


@pytest.mark.parametrize("rid", [True, 1.0, np.int64(1), np.float64(1), "1", None])
@pytest.mark.parametrize("call", ["free", "resize", "advance", "commit", "capacity", "block_table", "extend"])
def test_a_request_id_that_only_hashes_like_an_int_is_refused(rid: Any, call: str) -> None:
    m = admitted()
    before = snapshot(m)
    calls: dict[str, Callable[[], object]] = {
        "free": lambda: m.free(rid),
        "resize": lambda: m.resize(rid, 11, 10),
        "advance": lambda: m.advance(rid),
        "commit": lambda: m.commit(rid, 8),
        "capacity": lambda: m.capacity(rid),
        "block_table": lambda: m.block_table(rid, "full"),
        "extend": lambda: m.extend([2, rid]),
    }
    with pytest.raises(CacheUsageError, match="request id"):
        calls[call]()
    assert_unchanged(before, snapshot(m))
    assert 1 in m  # request 1 is still there


@pytest.mark.parametrize(
    "tokens", [{1: 2, 3: 4}, {5, 6, 7}, frozenset({1}), "abc", b"\x01\x02", 7, 3.5, object()], ids=repr
)
def test_tokens_that_are_no_sequence_of_ids_are_refused(tokens: Any) -> None:
    m = admitted()
    before = snapshot(m)
    with pytest.raises(CacheUsageError, match="token"):
        m.create(9, tokens)
    assert_unchanged(before, snapshot(m))
    assert 9 not in m


def test_tokens_from_a_generator_are_read_as_ids() -> None:
    m = manager(full_spec(tpb=4), {"full": 16})
    m.create(1, (t for t in range(100, 109)))  # type: ignore[arg-type]  # any iterable of ids is read
    assert m.resize(1, 10, 9)
    assert m.commit(1, 9) == 8


def test_a_huge_refused_dummy_batch_is_answered_at_once_and_changes_nothing() -> None:
    # 10**7 dummies on 64-page pools: the page arithmetic refuses them before any request exists
    m = admitted()
    before = snapshot(m)
    started = time.perf_counter()
    done = m.add_dummy_requests(10**7, 1)
    assert time.perf_counter() - started < 1.0
    free = {g: m.free_pages(g) for g in ("full", "sliding")}
    # a generation dummy of token_num 1: capacity 1, history 0 -> one page per group each
    assert not done and dict(done.short) == {g: 10**7 - free[g] for g in free}
    assert_unchanged(before, snapshot(m))
    assert m.num_requests == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.commit(1, 9, array("q", [-3])),  # packed (a scheduler's): the early return's check
        lambda m: m.commit(1, 8, array("q", [5, -3])),
        lambda m: m.commit(1, 9, [-3]),
        lambda m: m.commit(1, 9, ["a"]),
        lambda m: m.first_shared_fill(1, array("q", [-3]), 12),
        lambda m: m.first_shared_fill(1, [1.5], 12),
    ],
)
def test_bad_ids_of_a_request_are_refused_naming_it(call: Callable[[KVCacheManager], object]) -> None:
    # (the per-step checks build their message only when they fail: it still names the request)
    m = admitted()
    before = snapshot(m)
    with pytest.raises(CacheUsageError, match=r"^request 1: (commit|first_shared_fill)'s tokens"):
        call(m)
    assert_unchanged(before, snapshot(m))
