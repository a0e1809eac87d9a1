"""`ServingLimits` refuses, by name, what no engine serves: a batch past
`MAX_BATCH_SIZE` (the planner's time grows with it) and positions or token
counts past int32; everything inside the bounds is accepted. A library caller
gets the same refusal the CLI prints (the CLI has no bound of its own: it
names the option that set the field the library refused)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.cli.main import main
from kvpool.errors import LimitsError
from kvpool.plan.limits import MAX_BATCH_SIZE, MAX_POSITIONS, ServingLimits

INT32_MAX = 2**31 - 1  # positions in the engines' block tables are int32


def test_the_position_bound_is_int32() -> None:
    assert MAX_POSITIONS == INT32_MAX


fields = st.fixed_dictionaries(
    {
        "max_batch_size": st.integers(1, 2 * MAX_BATCH_SIZE),
        "max_seq_len": st.integers(1, 2**33),
        "max_num_tokens": st.one_of(st.none(), st.integers(1, 2**33)),
        "max_draft_len": st.integers(0, 2**33),
    }
)


@given(fields)
def test_limits_inside_the_bounds_are_accepted_and_the_rest_refused_by_name(kw: dict[str, Any]) -> None:
    over = [
        name
        for name, value in kw.items()
        if value is not None and value > (MAX_BATCH_SIZE if name == "max_batch_size" else INT32_MAX)
    ]
    past_headroom = kw["max_seq_len"] + 1 + kw["max_draft_len"] > INT32_MAX
    if not over and not past_headroom:
        limits = ServingLimits(**kw)
        assert (limits.max_batch_size, limits.max_seq_len) == (kw["max_batch_size"], kw["max_seq_len"])
        return
    with pytest.raises(LimitsError) as err:
        ServingLimits(**kw)
    assert any(name in str(err.value) for name in over) if over else "headroom" in str(err.value)


NOT_COUNTS = st.one_of(st.booleans(), st.floats(allow_nan=True), st.text(max_size=3), st.just([1]))
POSITIVE = ("max_batch_size", "max_seq_len", "max_num_tokens", "avg_seq_len")
NON_NEGATIVE = ("max_draft_len", "num_extra_kv_tokens")


@given(
    st.sampled_from(POSITIVE + NON_NEGATIVE),
    st.one_of(NOT_COUNTS, st.integers(-(2**40), 0)),
)
def test_a_field_that_is_not_a_count_in_range_is_refused_by_name(name: str, value: Any) -> None:
    if name in NON_NEGATIVE and value == 0 and type(value) is int:
        kw: dict[str, Any] = {name: value}
        assert getattr(ServingLimits(**kw), name) == 0  # zero drafts, zero extra tokens: fine
        return
    with pytest.raises(LimitsError, match=name):
        ServingLimits(**{name: value})


def test_a_huge_batch_is_refused_before_any_planning() -> None:
    with pytest.raises(LimitsError, match="max_batch_size must be at most"):
        ServingLimits(max_batch_size=2**40)


def test_the_cli_refuses_the_same_batch_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "qwen3-8b", "--kv-memory", "4GiB", "--max-batch-size", str(MAX_BATCH_SIZE + 1)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-batch-size" in err[0]
    assert f"max_batch_size must be at most {MAX_BATCH_SIZE}" in err[0]  # the library's message


@pytest.mark.parametrize(("flag", "field"), [("--max-num-tokens", "max_num_tokens"), ("--draft-len", "max_draft_len")])
def test_the_cli_names_the_option_of_a_token_count_past_int32(
    capsys: pytest.CaptureFixture[str], flag: str, field: str
) -> None:
    assert main(["plan", "qwen3-8b", "--kv-memory", "4GiB", flag, str(INT32_MAX + 1)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag}: {field} must be at most {INT32_MAX}" in err[0]
