"""Argument checks of the manager's public methods: each raises
`CacheUsageError` before anything changes, so a bad call leaves the pools as
they were. The common case (a plain `int`) is one type test: these sit on the
per-step path."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import cast

import numpy as np

from kvpool.cache.events import CacheUsageError


def as_position(value: object, what: str) -> int:
    """`value` as an int count of positions; refuses floats (60.9 is no page
    count to round), bools, strings and negative numbers."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, np.integer) and value >= 0:
        return int(value)
    raise CacheUsageError(f"{what} must be a non-negative integer, got {value!r}")


def check_rid(rid: object) -> int:
    """A request id: a plain int >= 0 (bools and numpy scalars are refused: they hash
    like ints and would alias another request)."""
    if type(rid) is not int or rid < 0:
        raise CacheUsageError(f"request ids are non-negative ints (negative ones are the dummies'), got {rid!r}")
    return rid


def check_tokens(tokens: Iterable[object], what: str = "tokens") -> list[int]:
    """`tokens` as a list of token ids (ints in [0, 2**63)); refuses strings,
    floats and ids past int64, which would hash but match no real prompt.
    An int64 array does the type and range test in C (prompts are long)."""
    out = cast("list[int]", list(tokens))  # checked next: the int64 array refuses anything else
    try:
        ids = array("q", out)
    except (TypeError, OverflowError) as e:
        raise CacheUsageError(f"{what} must be token ids (integers in [0, 2**63)): {e}") from None
    if ids and min(ids) < 0:
        raise CacheUsageError(f"{what}: token id {min(ids)} is negative")
    return out


def check_capacity(rid: int, capacity: int, limit: int) -> None:
    """A request may not ask for more positions than its pools were sized for:
    max_seq_len plus the decode headroom (draft and extra tokens)."""
    if capacity > limit:
        raise CacheUsageError(
            f"request {rid}: capacity {capacity} is past max_seq_len + headroom ({limit}) that the plan was sized for"
        )
