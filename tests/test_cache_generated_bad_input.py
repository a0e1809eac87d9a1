"""Bad values for every parameter of every public `KVCacheManager` method,
generated from the signatures themselves (the type hints say what a parameter
is; `BAD` says what is wrong for that kind): each call raises
`CacheUsageError` or answers falsy, and changes nothing. A new method or
parameter is covered without a new row, or fails `test_every_parameter_has_a_valid_value`."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from cache_helpers import assert_unchanged, snapshot, twin_spec
from kvpool.cache import CacheUsageError, KVCacheManager, TierSpec
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits

HUGE = 10**30  # past int64: no count of positions or pages

# bad values by the kind of parameter (read from the hints below)
BAD: dict[str, list[Any]] = {
    "int": [True, 1.5, "1", b"1", np.float64(1.0), [1], None, float("nan")],
    "count": [-1, HUGE],  # ints that are no count here
    "rid": [-(10**6), HUGE],  # ints no request has
    "sequence": [7, 1.5, "abc", b"ab", {1: 2}, {1, 2}, [1.5], [-1], [True], [HUGE], [None]],
    "group": [5, None, "", "nope", b"full"],
}

# a valid value for each parameter name (substituted one at a time by a bad one)
VALID: dict[str, Any] = {
    "rid": 1,
    "capacity": 12,
    "history": 9,
    "token": 7,
    "tokens": [1, 2],
    "num_tokens": 1,
    "upto": 16,
    "group": "full",
    "rids": [1, 2],
    "capacities": [12, 12],
    "histories": [9, 9],
    "batch_size": 1,
    "token_num": 1,
    "draft_len": 0,
    "is_gen": True,
    "frozen": False,
    "salt": "tenant",
    "batch_sizes": [1],
    "draft_lens": [0],
    "copies": None,
}
# parameters whose ints are request ids, and those whose ints may not be negative or huge
RID_PARAMS = {"rid"}
COUNT_PARAMS = {"capacity", "history", "num_tokens", "upto", "batch_size", "token_num", "draft_len"}
# bools, any hashable salt, an engine object: nothing generic to get wrong
SKIP = {"is_gen", "frozen", "salt", "copies"}


def kind(name: str, hint: Any) -> list[str]:
    """The kinds of bad value a parameter takes, from its name and type hint."""
    text = str(hint)
    if name in SKIP:
        return []
    if name == "group":
        return ["group"]
    if hint is int or text == "int | None":
        return ["int"] + (["rid"] if name in RID_PARAMS else ["count"] if name in COUNT_PARAMS else [])
    if "Sequence" in text or "Iterable" in text or "ArrayLike" in text or "_SupportsArray" in text:
        return ["sequence"]
    return []


def cases() -> Iterator[tuple[str, str, Any]]:
    for name, fn in inspect.getmembers(KVCacheManager, inspect.isfunction):
        if name.startswith("_"):
            continue
        hints = typing.get_type_hints(fn)
        for param in list(inspect.signature(fn).parameters)[1:]:
            for k in kind(param, hints.get(param)):
                for value in BAD[k]:
                    if value is None and "None" in str(hints.get(param)):  # None is a valid value there
                        continue
                    yield name, param, value


CASES = list(cases())


def manager() -> KVCacheManager:
    """Requests 1 and 2 prefilled (9 tokens each, 4-token pages), a host tier, reuse on."""
    plan = PoolPlan.from_pages(twin_spec(tpb=4, window=8), {"full": 64, "sliding": 64}, ServingLimits(max_seq_len=64))
    m = KVCacheManager(plan, tiers=[TierSpec(Medium.CPU, 1 << 20)])
    for rid in (1, 2):
        m.create(rid, list(range(10 * rid, 10 * rid + 9)))
        assert m.resize(rid, 10, 9)
    return m


def test_there_are_many_generated_cases() -> None:
    assert len(CASES) > 200, len(CASES)


def test_every_parameter_has_a_valid_value() -> None:
    for name, fn in inspect.getmembers(KVCacheManager, inspect.isfunction):
        if not name.startswith("_"):
            missing = [p for p in list(inspect.signature(fn).parameters)[1:] if p not in VALID]
            assert not missing, f"{name}: add a valid value for {missing} to VALID"


@pytest.mark.parametrize(("method", "param", "value"), CASES, ids=[f"{m}-{p}-{v!r}"[:60] for m, p, v in CASES])
def test_a_bad_value_is_a_typed_error_or_a_refusal_and_changes_nothing(method: str, param: str, value: Any) -> None:
    m = manager()
    fn: Callable[..., Any] = getattr(m, method)
    params = list(inspect.signature(fn).parameters)
    args = {p: VALID[p] for p in params}
    args[param] = value
    before = snapshot(m)
    try:
        result = fn(**args)
    except CacheUsageError:
        assert_unchanged(before, snapshot(m))
        return
    # accepted: only as a refusal (falsy) that changed nothing
    assert_unchanged(before, snapshot(m))
    assert not result, f"{method}({param}={value!r}) was accepted: {result!r}"


def test_refusals_name_what_was_wrong() -> None:
    m = manager()
    with pytest.raises(CacheUsageError, match="capacity"):
        m.resize(1, -1)
    with pytest.raises(CacheUsageError, match="group"):
        m.free_pages("nope")
