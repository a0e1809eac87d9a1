"""Argument checks of the manager's public methods: each raises
`CacheUsageError` before anything changes, so a bad call leaves the pools as
they were. The common case (a plain `int`) is one type test: these sit on the
per-step path."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from functools import lru_cache
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from kvpool.cache.events import CacheUsageError

INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1


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
    if type(rid) is not int or not 0 <= rid <= INT64_MAX:
        raise CacheUsageError(
            f"request ids are non-negative ints within int64 (negative ones are the dummies'), got {rid!r}"
        )
    return rid


def as_list(values: object, what: str) -> list[Any]:
    """`values` (a list, tuple, range, array or other iterable of items) as a
    list; a string, bytes, mapping, set or scalar is refused: iterating them
    would read characters, keys or an arbitrary order as the items."""
    if isinstance(values, (str, bytes, bytearray, Mapping, Set)) or not isinstance(values, Iterable):
        raise CacheUsageError(f"{what} must be a sequence, got {type(values).__name__}")
    return values if type(values) is list else list(values)


def check_tokens(
    tokens: Iterable[object], what: str = "tokens", *, copy: bool = True, rid: int | None = None
) -> array[int]:
    """`tokens` as a new int64 array of token ids (ints in [0, 2**63));
    refuses strings, floats and ids past int64, which would hash but match no
    real prompt. An int64 array (a scheduler's `Sequence.token_ids`, packed once)
    is copied and its sign checked, both in C; anything else is packed by
    `struct` in C (prompts are long; it is about twice as fast as building the
    array from the list). The array's bytes are what the page digests hash
    (`cache/hashing.py`). `copy=False` returns such an array itself, checked,
    for a caller that only reads it. `rid`: the request the ids are of, named
    in an error (the message is built only then: some callers are per-step)."""
    if type(tokens) is array and tokens.typecode == "q":  # already int64: copied, not packed again
        ids = tokens[:] if copy else tokens
    else:  # a list or tuple goes straight in; anything else is listed first (`array("q", b"..")` reads bytes)
        items = tokens if type(tokens) is list or type(tokens) is tuple else as_list(tokens, of(rid, what))
        try:
            data = int64_packer(len(items))(*items)
        except struct.error as e:
            raise CacheUsageError(f"{of(rid, what)} must be token ids (integers in [0, 2**63)): {e}") from None
        ids = array("q")
        ids.frombytes(data)
    if ids and not non_negative(ids):
        raise CacheUsageError(f"{of(rid, what)}: token id {min(ids)} is negative")
    return ids


def of(rid: int | None, what: str) -> str:
    """`what` of request `rid` (None: of no request), for an error message."""
    return what if rid is None else f"request {rid}: {what}"


SIGN_BYTE = 7 if sys.byteorder == "little" else 0  # the byte of an int64 that holds its sign bit


def non_negative(ids: array[int]) -> bool:
    """Whether every id of the int64 array `ids` is >= 0: no sign bit set,
    tested on the bytes in C (`min()` makes an int of each id, about 250
    instructions an id; NumPy's reduction costs about 14,000 a call, which
    pays past about a thousand ids: callgrind, 9,900 against 15,200 at 1,024)."""
    if len(ids) <= 1024:
        return ids.tobytes()[SIGN_BYTE::8].isascii()
    return int(np.frombuffer(ids, np.int64).min()) >= 0


@lru_cache(maxsize=64)
def int64_packer(count: int) -> Callable[..., bytes]:
    """`struct.Struct("<{count}q").pack`, made once per prompt length: a
    compiled `Struct` skips the format cache that `struct.pack` consults on
    every call (a few µs for a 4,096-token prompt)."""
    return struct.Struct(f"<{count}q").pack


def check_few_tokens(tokens: Iterable[object], what: str = "tokens", *, rid: int | None = None) -> Sequence[int]:
    """`check_tokens` for the few tokens a decode step commits: a short list
    or tuple of plain ints in range is returned as it is (a loop beats
    building an array for one token); anything else goes to `check_tokens`."""
    if (type(tokens) is tuple or type(tokens) is list) and len(tokens) <= 8:
        for x in tokens:
            if type(x) is bool:  # struct would pack it as 0 or 1
                raise CacheUsageError(f"{of(rid, what)} must be token ids, got {x!r}")
            if type(x) is not int or not 0 <= x <= INT64_MAX:
                break
        else:
            return cast("Sequence[int]", tokens)
    return check_tokens(tokens, what, rid=rid)


def check_capacity(rid: int, capacity: int, limit: int) -> None:
    """A request may not ask for more positions than its pools were sized for:
    max_seq_len plus the decode headroom (draft and extra tokens)."""
    if capacity > limit:
        raise CacheUsageError(
            f"request {rid}: capacity {capacity} is past max_seq_len + headroom ({limit}) that the plan was sized for"
        )


def check_shape(rid: int, cap: int, hist: int, old: int) -> None:
    """A resize keeps capacity >= history >= the previous history."""
    if cap < hist or hist < old:
        raise CacheUsageError(
            f"request {rid}: need capacity >= history >= previous history, got capacity {cap}, "
            f"history {hist}, previous history {old}"
        )


def checked_shape(rid: int, capacity: object, history: object, old: int, limit: int | None) -> tuple[int, int]:
    """The (capacity, history) a single resize of `rid` asks for, checked:
    integer positions (`history` None: unchanged, `old`), capacity >= history
    >= `old`, and capacity within `limit` (None: a dummy, which has no limit)."""
    cap = as_position(capacity, "capacity")
    hist = old if history is None else as_position(history, "history")
    check_shape(rid, cap, hist, old)
    if limit is not None and cap > limit:
        check_capacity(rid, cap, limit)
    return cap, hist


def batch_positions(values: npt.ArrayLike, shape: tuple[int, ...], what: str) -> npt.NDArray[np.int64]:
    """`values` as int64 positions of `shape` (a scalar broadcasts); one
    per request, whole numbers, else `CacheUsageError`."""
    array = np.asarray(values)
    if array.dtype.kind not in "iu" and array.size:
        raise CacheUsageError(f"resize_many: {what} must be integers, got dtype {array.dtype}")
    if array.ndim and array.shape != shape:
        raise CacheUsageError(f"resize_many: {len(array)} {what} for {shape[0]} requests")
    return np.broadcast_to(array.astype(np.int64, copy=False), shape)


def int_positions(values: npt.ArrayLike, n: int, what: str) -> Sequence[int]:
    """`batch_positions(values, (n,), what)` as plain ints: a list or tuple of
    `n` plain ints as it is (a scheduler's own list each step: a loop over it
    costs a fraction of building and checking an array)."""
    if isinstance(values, (list, tuple)) and len(values) == n:
        for v in values:
            if type(v) is not int:
                break
        else:
            return values
    positions: list[int] = batch_positions(values, (n,), what).tolist()
    return positions


def check_dummy_args(batch_size: int, token_num: int, draft_len: int) -> None:
    """Raise `CacheUsageError` unless batch_size, token_num >= 1 and draft_len >= 0
    are integers (at most int32: no batch, prompt or draft is longer)."""
    for name, value, low in (("batch_size", batch_size, 1), ("token_num", token_num, 1), ("draft_len", draft_len, 0)):
        if type(value) is not int or not low <= value <= INT32_MAX:
            raise CacheUsageError(f"{name} must be an integer in [{low}, 2**31), got {value!r}")
