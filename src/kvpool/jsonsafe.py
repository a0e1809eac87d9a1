"""JSON from files nobody here wrote (traces, safetensors headers, grids,
calibration profiles, model configs), read with its numbers and nesting bounded:

- an integer has at most `MAX_DIGITS` digits: past about 4,300 Python's
  int-string limit raises an untyped ValueError, and a 4,000-digit count
  overflows the first float it meets;
- a number is finite: json reads `NaN`, `Infinity` and `1e400` as floats no
  count or time can be (a model config may hold `Infinity`, which Python's json
  writes and transformers' configs use: `constants=True` lets it through, to the
  field checks of spec/fields.py);
- nesting deeper than the parser's recursion is an error, not a RecursionError.

Each failure is one `JSONValueError` (a ValueError) saying what; callers name
the file.
"""

from __future__ import annotations

import json
import math
from typing import Any

# No count, size or id kvpool reads has more digits (2**64 has 20).
MAX_DIGITS = 30


class JSONValueError(ValueError):
    """A JSON text that is not JSON, or holds a number or a nesting past the bounds."""


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_DIGITS:
        raise JSONValueError(f"an integer of {digits} digits ({text[:12]}...) is not a value kvpool reads")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONValueError(f"the number {text[:24]} is too large for a float")
    return value


def _constant(name: str) -> float:
    raise JSONValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
_WITH_CONSTANTS = json.JSONDecoder(parse_int=_int)
# The C scanner's own int parsing (3x faster on a trace of token ids): integers up to
# Python's int-string limit come through, for a caller that bounds every one it reads.
_FAST_INTS = json.JSONDecoder(parse_float=_float, parse_constant=_constant)


def loads(text: str | bytes, *, caller_bounds_ints: bool = False, constants: bool = False) -> Any:
    """The JSON value of `text` (bytes are read as UTF-8, a byte-order mark
    allowed), within the bounds above; JSONValueError otherwise. With
    `caller_bounds_ints` integers are bounded only by Python's int-string limit
    (about 4,300 digits): the caller checks each one it reads. With `constants`,
    NaN, Infinity and -Infinity are read as floats."""
    decoder = _FAST_INTS if caller_bounds_ints else _WITH_CONSTANTS if constants else _DECODER
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8-sig")
        return decoder.decode(text)
    except JSONValueError:
        raise
    except UnicodeDecodeError as e:
        raise JSONValueError(f"not UTF-8 text ({e})") from None
    except ValueError as e:  # not a JSONDecodeError: an integer past Python's int-string limit
        if not isinstance(e, json.JSONDecodeError):
            raise JSONValueError("holds an integer of thousands of digits, not a value kvpool reads") from None
        raise JSONValueError(f"not valid JSON: {e}") from None
    except RecursionError:
        raise JSONValueError("nested too deeply to be read") from None
