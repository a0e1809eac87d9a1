"""Byte sizes as people write them (`40GiB`, `512MiB`, `1.5e9`) and back,
durations (`2s`, `50ms`), and the one test of a count (`is_positive_int`) every layer checks its arguments with."""

from __future__ import annotations

import decimal
import numbers
import re
from typing import TypeGuard

from kvpool.errors import KvpoolError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
# 1 EiB: far past any machine, and small enough that every sum of sizes stays exact in int64.
MAX_SIZE = 2**60


def parse_size(text: str | int) -> int:
    """Bytes in `text`: a plain integer, or a number with a unit (KiB/MiB/GiB/TiB
    are powers of 2; KB/MB/GB/TB powers of 10; a bare K/M/G/T means KiB/MiB/GiB/TiB)."""
    if isinstance(text, bool) or not isinstance(text, str | numbers.Integral):
        # True would be 1 byte, and a float or None an untyped TypeError from the regex
        raise KvpoolError(f"a size is a string such as '40GiB' or a whole number of bytes, got {text!r}")
    if isinstance(text, numbers.Integral):
        number = decimal.Decimal(int(text))
    else:
        match = _SIZE.match(text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise KvpoolError(f"cannot read size {text!r}; write e.g. 40GiB, 512MiB or 1073741824")
        # exact decimal arithmetic: as a float, 2**60 + 1 bytes rounded down to 1 EiB and passed
        number = _decimal(match.group(1), text)
        if 0 < number <= MAX_SIZE:  # a multiplication that cannot overflow Decimal's exponent
            number *= _UNITS[unit]
    if number > MAX_SIZE:
        raise KvpoolError(f"size {text!r} is larger than 1 EiB; write the budget of one GPU, e.g. 40GiB")
    if number < 1:  # before int(): -1e9606846977 as an int has billions of digits
        raise KvpoolError(f"size {text!r} must be positive")
    return int(number)


def _decimal(number: str, text: str | int) -> decimal.Decimal:
    """The number part of a size, exactly; an exponent past what Decimal holds
    (`1e4011...` with 50 digits) is a size no budget is."""
    try:
        return decimal.Decimal(number)
    except decimal.InvalidOperation:
        raise KvpoolError(f"size {text!r} has an exponent no size has; write e.g. 40GiB") from None


def size_or_zero(text: str | int) -> int:
    """Bytes in `text` (`parse_size`), or 0 for a size of zero in any unit (`0`,
    `0B`, `0GiB`, `0.0MiB`): a part of the GPU, or a cold tier, that is not there."""
    match = _SIZE.match(text) if isinstance(text, str) else None
    if match is not None and match.group(2).lower() in _UNITS and _decimal(match.group(1), text) == 0:
        return 0
    if isinstance(text, int) and not isinstance(text, bool) and text == 0:
        return 0
    return parse_size(text)


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(ms|s|us|min)?\s*$", re.IGNORECASE)
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def parse_duration(text: str) -> float:
    """Seconds in `text`: a number with a unit (`50ms`, `2s`, `250us`, `1min`),
    a bare number being seconds. Positive and finite, else KvpoolError."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise KvpoolError(f"cannot read duration {text!r}; write e.g. 2s, 50ms or 0.5")
    value = float(match.group(1)) * _SECONDS[(match.group(2) or "s").lower()]
    if not 0 < value < float("inf"):
        raise KvpoolError(f"duration {text!r} must be positive and finite")
    return value


def is_positive_int(value: object) -> TypeGuard[int]:
    """A count: an `int` >= 1 (a bool is not one, nor a float that is whole)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def format_bytes(n: float) -> str:
    """`n` bytes in the largest binary unit that keeps the number ≥ 1."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
