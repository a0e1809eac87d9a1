"""`Sequence.token_ids`: the prompt packed once, then extended by the outputs,
always equal to `all_ids` (prompt + output)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache.events import CacheUsageError
from kvpool.sched import Sequence
from kvpool.sched.sequence import append_tokens

ids = st.integers(0, 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(ids, min_size=1, max_size=40),
    script=st.lists(st.one_of(st.lists(ids, min_size=1, max_size=12), st.just("read"), st.just("reset")), max_size=20),
    packed=st.booleans(),
)
def test_token_ids_are_prompt_plus_output(prompt: list[int], script: list[object], packed: bool) -> None:
    # a packed prompt is shared with `token_ids` until outputs extend them: the prompt never changes
    seq = Sequence(rid=1, prompt_ids=array("q", prompt) if packed else list(prompt), max_new_tokens=1 << 20)
    for op in script:
        if op == "reset":  # a caller replaces the output list with a shorter copy
            seq.output_ids = seq.output_ids[: len(seq.output_ids) // 2]
        elif op != "read":
            assert isinstance(op, list)
            append_tokens(seq, op, 1 << 30)
        assert list(seq.token_ids) == prompt + seq.output_ids == seq.all_ids
        assert list(seq.prompt_ids) == prompt and seq.prompt_len == len(prompt)
    assert list(seq.token_ids) == seq.all_ids


def test_token_ids_are_kept_between_calls() -> None:
    # the prompt is packed once: later calls hand back the same array, grown by the new outputs only
    seq = Sequence(rid=1, prompt_ids=list(range(1000)), max_new_tokens=10)
    first = seq.token_ids
    assert seq.token_ids is first
    append_tokens(seq, [5], 1 << 20)
    assert seq.token_ids is first and first[-1] == 5 and len(first) == 1001


def test_packed_prompt_is_copied_only_when_outputs_extend_it() -> None:
    prompt = array("q", range(1000))
    seq = Sequence(rid=1, prompt_ids=prompt, max_new_tokens=10)
    assert seq.token_ids is prompt  # checked, not copied
    append_tokens(seq, [5], 1 << 20)
    grown = seq.token_ids
    assert grown is not prompt and list(grown) == [*range(1000), 5] and prompt == array("q", range(1000))
    append_tokens(seq, [6], 1 << 20)
    assert seq.token_ids is grown and grown[-2:] == array("q", [5, 6])


def test_packed_prompt_is_still_checked() -> None:
    seq = Sequence(rid=1, prompt_ids=array("q", [1, -2, 3]), max_new_tokens=10)
    with pytest.raises(CacheUsageError, match="negative"):
        seq.token_ids  # noqa: B018


@settings(max_examples=200, deadline=None)
@given(
    run=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    eos=st.one_of(st.none(), st.integers(0, 5), st.tuples(st.integers(0, 5), st.integers(0, 5))),
    max_new=st.integers(1, 40),
    max_len=st.integers(5, 60),
)
def test_a_run_of_tokens_appends_as_one_at_a_time(
    run: list[int], eos: int | tuple[int, int] | None, max_new: int, max_len: int
) -> None:
    # a fast-forwarded run hands a row all its tokens at once: the same output and ending as step by step
    at_once = Sequence(rid=1, prompt_ids=[7, 7, 7, 7], max_new_tokens=max_new, eos_token_id=eos)
    one_by_one = Sequence(rid=2, prompt_ids=[7, 7, 7, 7], max_new_tokens=max_new, eos_token_id=eos)
    ended = append_tokens(at_once, run, max_len)
    ended_alone = False
    for t in run:
        if append_tokens(one_by_one, [t], max_len):
            ended_alone = True
            break
    assert ended == ended_alone
    assert at_once.output_ids == one_by_one.output_ids
    assert (at_once.status, at_once.finish_reason) == (one_by_one.status, one_by_one.finish_reason)
