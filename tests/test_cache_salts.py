"""Salts scope prefix reuse: requests under different salts never share a page,
whatever the salts' types or Python's `hash()` of them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, manager
from kvpool.cache import CacheUsageError
from kvpool.cache.hashing import ROOT_HASH, salt_seed

PROMPT = list(range(1000, 1100))  # 100 tokens: (100 - 1) // 16 = 6 reusable pages of 16
Salt = str | bytes | int | None


def hit_under(first: Salt, second: Salt) -> int:
    """Tokens reused by a request under `second` after the same prompt was
    computed and committed under `first`."""
    m = manager(full_spec(tpb=16), {"full": 20})
    assert m.create(1, PROMPT, salt=first) == 0
    assert m.resize(1, len(PROMPT) + 1, len(PROMPT))
    m.commit(1, len(PROMPT))
    hit = m.create(2, PROMPT, salt=second)
    m.check_integrity()
    return hit


# pairs that Python's hash() maps alike, or that differ only in type
COLLIDING_UNDER_HASH = [
    (-1, -2),
    (5, 5 + 2**61 - 1),
    (0, 2**61 - 1),
    (1, "1"),
    ("1", b"1"),
    (1, b"1"),
    (1, True),
    (0, False),
    (None, 0),
    (None, ""),
    ("", b""),
]


def test_python_hash_really_collides_on_the_integer_pairs() -> None:
    # the premise of the defect: these are the pairs hash() cannot tell apart
    assert hash(-1) == hash(-2)
    assert hash(5) == hash(5 + 2**61 - 1)


@pytest.mark.parametrize(("a", "b"), COLLIDING_UNDER_HASH)
def test_distinct_salts_never_share_pages(a: Salt, b: Salt) -> None:
    assert salt_seed(a) != salt_seed(b)
    assert hit_under(a, b) == 0
    assert hit_under(b, a) == 0


@pytest.mark.parametrize("salt", [None, -1, 5 + 2**61 - 1, "1", b"1", 2**200, -(2**200)])
def test_the_same_salt_reuses_its_pages(salt: Salt) -> None:
    assert hit_under(salt, salt) == 96  # 6 whole pages of 16


def test_seeds_are_stable_across_processes() -> None:
    # a digest, not hash(): pinned values a router can rely on between runs
    assert salt_seed(None) == ROOT_HASH
    assert salt_seed("tenant-a") == salt_seed("tenant-a")
    assert salt_seed(b"tenant-a") != salt_seed("tenant-a")


@pytest.mark.parametrize("bad", [[1, 2], 1.5, {"a": 1}])
def test_a_salt_of_another_type_is_refused(bad: object) -> None:
    with pytest.raises(CacheUsageError, match="salt"):
        salt_seed(bad)  # type: ignore[arg-type]


salts = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.binary(max_size=8))


@settings(max_examples=60, deadline=None)
@given(salts, salts)
def test_random_pairs_of_distinct_salts_are_isolated(a: Salt, b: Salt) -> None:
    same = type(a) is type(b) and a == b
    assert (salt_seed(a) == salt_seed(b)) == same
    assert hit_under(a, b) == (96 if same else 0)


def committed_then_looked_up(first: Salt, second: Salt) -> tuple[int, list[int]]:
    """A request created without its prompt (tokens passed to `commit`, as an
    engine that learns them late does) under `first`; a later lookup under
    `second`: its hit, and the digests the first one's events carried."""
    m = manager(full_spec(tpb=16), {"full": 20})
    assert m.create(1, None, salt=first) == 0
    assert m.resize(1, len(PROMPT) + 1, len(PROMPT))
    m.commit(1, len(PROMPT), PROMPT)
    hashes = [e.block_hash for e in m.take_events() if e.kind == "stored"]
    hit = m.create(2, PROMPT, salt=second)
    m.check_integrity()
    return hit, hashes


@pytest.mark.parametrize(("a", "b"), [("tenant-a", "tenant-b"), (None, "x"), (1, 2)])
def test_the_salt_of_a_request_created_without_tokens_scopes_its_commit(a: Salt, b: Salt) -> None:
    # `create(rid, None, salt=...)` then `commit(..., tokens=...)` kept no salt: two tenants'
    # identical tokens published identical digests and each hit the other's pages
    hit_a, hashes_a = committed_then_looked_up(a, a)
    hit_b, hashes_b = committed_then_looked_up(b, a)
    assert len(hashes_a) == len(hashes_b) == len(PROMPT) // 16
    assert set(hashes_a).isdisjoint(hashes_b)
    assert hit_a == (len(PROMPT) - 1) // 16 * 16 and hit_b == 0
    # and the digests are the ones a request created with its prompt gets
    assert committed_then_looked_up(None, None)[0] == hit_under(None, None)
