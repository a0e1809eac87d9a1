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
