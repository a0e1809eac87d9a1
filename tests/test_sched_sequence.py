"""`Sequence.token_ids`: the prompt packed once, then extended by the outputs,
always equal to `all_ids` (prompt + output)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.sched import Sequence
from kvpool.sched.sequence import append_tokens

ids = st.integers(0, 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(ids, min_size=1, max_size=40),
    script=st.lists(st.one_of(st.lists(ids, min_size=1, max_size=12), st.just("read"), st.just("reset")), max_size=20),
)
def test_token_ids_are_prompt_plus_output(prompt: list[int], script: list[object]) -> None:
    seq = Sequence(rid=1, prompt_ids=list(prompt), max_new_tokens=1 << 20)
    for op in script:
        if op == "reset":  # a caller replaces the output list with a shorter copy
            seq.output_ids = seq.output_ids[: len(seq.output_ids) // 2]
        elif op != "read":
            assert isinstance(op, list)
            append_tokens(seq, op, 1 << 30)
        assert list(seq.token_ids) == prompt + seq.output_ids == seq.all_ids
    assert list(seq.token_ids) == seq.all_ids


def test_token_ids_are_kept_between_calls() -> None:
    # the prompt is packed once: later calls hand back the same array, grown by the new outputs only
    seq = Sequence(rid=1, prompt_ids=list(range(1000)), max_new_tokens=10)
    first = seq.token_ids
    assert seq.token_ids is first
    append_tokens(seq, [5], 1 << 20)
    assert seq.token_ids is first and first[-1] == 5 and len(first) == 1001
