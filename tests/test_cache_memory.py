"""What a live request holds: not its prompt. A request keeps the token ids
past its digested pages only (`Request.base`, cache/request.py), so a server
admitting many long prompts does not hold each one a second time (and does
not fault in fresh memory for each copy); commits after that are unchanged.
With events recorded, whose stored events name every page's ids, a request
keeps its ids (one int64 copy)."""

from __future__ import annotations

import tracemalloc
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, manager
from kvpool.cache import CacheUsageError
from kvpool.cache.checks import INT64_MAX, check_tokens, non_negative
from kvpool.cache.hashing import extend_hashes, salt_seed

TPB = 16
PROMPT = 4096 + 7  # tokens: 256 whole pages and a partial one
REQUESTS = 16


def held_per_request(prompts: list[list[int]], *, events: bool = False, commit: bool = False) -> float:
    """Bytes the manager's allocations grow by per admitted request (prompt
    computed, and committed with `commit`; the events taken)."""
    m = manager(
        full_spec(TPB),
        {"full": REQUESTS * (PROMPT // TPB + 2)},
        events=events,
        max_batch_size=REQUESTS,
        max_seq_len=8192,
    )
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for rid, prompt in enumerate(prompts):
        assert m.resize(rid, PROMPT, m.create(rid, prompt))
        if commit:
            assert m.resize(rid, PROMPT, PROMPT)
            m.commit(rid, PROMPT)
        m.take_events()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return grown / len(prompts)


PROMPTS = [[rid * 100_000 + i for i in range(PROMPT)] for rid in range(REQUESTS)]
# an int64 copy of a prompt is 8 bytes a token; what a request must hold is its 256 digests
# (a list of Python ints, ~40 bytes each) and a page of ids
COPY = 8 * PROMPT


def test_live_requests_do_not_hold_their_prompts() -> None:
    assert held_per_request(PROMPTS) < COPY * 0.75


def test_with_events_a_request_holds_its_ids_and_every_stored_event_names_them() -> None:
    # the ids are what routers key on: a request keeps them while events are recorded (as vLLM's
    # request keeps all_token_ids), and nothing more than one int64 copy
    with_events = held_per_request(PROMPTS, events=True)
    assert COPY * 0.9 < with_events - held_per_request(PROMPTS) < COPY * 1.25
    m = manager(full_spec(TPB), {"full": PROMPT // TPB + 2}, max_seq_len=8192)
    m.create(0, PROMPTS[0])
    assert m.resize(0, PROMPT, PROMPT)
    m.commit(0, PROMPT)
    stored = [e for e in m.take_events() if e.kind == "stored"]
    assert [i for e in stored for i in e.token_ids] == PROMPTS[0][: PROMPT // TPB * TPB]


def test_commits_after_the_prompt_hash_every_token() -> None:
    """Generated tokens committed one by one past a long prompt give the pages
    the chain of the whole sequence would (a page hashed from the wrong ids
    would not be found by a request that repeats the sequence)."""
    m = manager(full_spec(TPB), {"full": 64}, max_seq_len=1024)
    prompt, generated = list(range(1000, 1000 + 5 * TPB + 3)), list(range(7, 7 + 3 * TPB))
    m.create(0, prompt)
    assert m.resize(0, len(prompt), 0)
    assert m.resize(0, len(prompt), len(prompt))
    m.commit(0, len(prompt))
    for i, token in enumerate(generated):
        n = len(prompt) + i + 1
        assert m.resize(0, n, n)
        assert m.commit(0, n, (token,)) == n // TPB * TPB
    want: list[int] = []
    extend_hashes(want, check_tokens(prompt + generated), TPB, salt_seed(None), (len(prompt) + len(generated)) // TPB)
    assert set(want) <= set(m.pools[0].cached)
    m.free(0)
    again = prompt + generated + [1]  # its whole pages are all cached: a hit of every one
    assert m.create(1, again) == len(want) * TPB


def test_check_tokens_copies_an_int64_array_unless_told_the_caller_only_reads_it() -> None:
    ids = array("q", [3, 1, 2])
    copied, read = check_tokens(ids), check_tokens(ids, copy=False)
    assert copied == ids and copied is not ids and read is ids
    with pytest.raises(CacheUsageError, match="negative"):
        check_tokens(array("q", [3, -1]), copy=False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(2**63), INT64_MAX), max_size=40),
    st.lists(st.integers(0, INT64_MAX), min_size=1, max_size=40),
    st.integers(1, 300),
)
def test_the_sign_test_on_bytes_agrees_with_min(mixed: list[int], ids: list[int], times: int) -> None:
    # short arrays are tested on their sign bytes, long ones (past 1,024 ids) by NumPy: both say what min() says
    for values in (mixed, ids * times, ids * times + mixed, mixed + ids * times):
        packed = array("q", values)
        assert non_negative(packed) == (not values or min(values) >= 0)
