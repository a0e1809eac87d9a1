"""Helpers shared by subcommands: model options, JSON and table output."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvpool import presets
from kvpool.errors import KvpoolError
from kvpool.plan.batches import REFERENCE_REQUEST
from kvpool.spec import KV_DTYPES, ModelSpec
from kvpool.units import parse_size, size_or_zero

# Past this a count is a typo, and sizes derived from it would overflow int64.
MAX_COUNT = 2**40


def int_at_least(low: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: an integer in [`low`, `high`] (one clear message otherwise)."""
    what = "a positive integer" if low == 1 else f"an integer >= {low}" if low else "a non-negative integer"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if value > high:
            raise argparse.ArgumentTypeError(f"expected at most {high:,}, got {text!r}")
        return value

    return parse


positive_int = int_at_least(1)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (nan, inf and 0 are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (nan, inf and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a share in (0, 1] (nan, inf, 0 and above 1 are refused)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:  # False for nan too
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1], got {text!r}")
    return value


def checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that runs the library's own reader of a value (`check`)
    while the options are parsed, so that its error comes out naming the flag
    (`argument --kv-memory: size '-1GiB' must be positive`). The text is kept:
    the command reads it again with the same reader and prints it as given."""

    def parse(text: str) -> str:
        try:
            check(text)
        except KvpoolError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    parse.__qualname__ = f"checked_{getattr(check, '__name__', 'value')}"
    return parse


size_arg = checked(parse_size)  # a byte size > 0 (units.parse_size)
size_or_zero_arg = checked(size_or_zero)  # the same, or 0 (a part of the GPU the engine does not use)


def kv_dtype_name(text: str) -> str:
    """`text` if it names a KV dtype (case-insensitive), else a KvpoolError."""
    if text.lower() not in KV_DTYPES:
        raise KvpoolError(f"unsupported kv dtype {text!r}; choose one of {', '.join(KV_DTYPES)}")
    return text


def gpu_name(text: str) -> str:
    """`text` if it names a GPU preset or is `auto` (read later, through NVML), else
    the preset loader's KvpoolError with its suggestions."""
    if text.lower() != "auto":
        presets.load_gpu(text)
    return text


def int_items(text: str, *, low: int = 1, high: int = MAX_COUNT) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): integers in [low, high], comma-separated, no empty item
    (`1,,2` and a trailing comma are typos, not a shorter list). KvpoolError otherwise."""
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise KvpoolError(f"expected comma-separated integers with no empty item, e.g. 1,2,4; got {text!r}")
    values = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise KvpoolError(f"expected comma-separated integers: {item.strip()!r} in {text!r} is not one") from None
        if not low <= value <= high:
            raise KvpoolError(f"expected comma-separated integers in [{low}, {high:,}]; got {item.strip()} in {text!r}")
        values.append(value)
    return tuple(values)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """MODEL plus the options that shape its KV spec."""
    p.add_argument(
        "model",
        metavar="MODEL",
        help="preset name (kvpool models), path to a config.json (or its folder), or Hugging Face id "
        "org/name[@revision] (local cache first; HF_HUB_OFFLINE=1: cache only)",
    )
    p.add_argument(
        "--kv-dtype",
        type=checked(kv_dtype_name),
        default="auto",
        help=f"KV storage dtype: {', '.join(KV_DTYPES)} (default auto)",
    )
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size; the spec is one rank's")
    p.add_argument(
        "--pp", type=positive_int, default=1, help="pipeline stages; the spec is the stage with the most KV bytes"
    )
    p.add_argument(
        "--ep", type=positive_int, default=1, help="expert-parallel size (divides --tp): shards routed experts"
    )
    p.add_argument(
        "--dp",
        type=positive_int,
        default=1,
        help="data-parallel attention (divides --tp): attention and KV split over tp/dp ranks, each with its own requests",
    )
    p.add_argument(
        "--tokens-per-block",
        type=positive_int,
        default=None,
        metavar="T",
        help="page size in positions (default 32; 128 for DeepSeek-V4)",
    )


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def concurrency_text(counts: Mapping[str, Any], max_seq_len: int, avg_seq_len: int | None) -> str:
    """`465 of 2,049 positions (the reference request), 118 of 8,192 (max_seq_len)`:
    requests that fit at once, each count with the length it is counted at. A count
    may be text (`153 / 153`: an engine's beside kvpool's)."""
    parts = [f"{counts['reference']} of {REFERENCE_REQUEST[0]:,} positions (the reference request)"]
    if avg_seq_len is not None:
        parts.append(f"{counts['avg_seq_len']} of {avg_seq_len:,} (avg_seq_len)")
    parts.append(f"{counts['max_seq_len']} of {max_seq_len:,} (max_seq_len)")
    return ", ".join(parts)


def say_fallback(spec: ModelSpec) -> None:
    """One stderr line when a bundled preset stood in for an unreachable hub id."""
    if spec.source is not None and spec.source.fallback:
        print(f"kvpool: note: {spec.source.fallback}", file=sys.stderr)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table: numbers right-aligned, text left-aligned."""
    body = [list(map(_cell, r)) for r in rows]
    columns = list(zip(*([str(h) for h in headers], *body), strict=True))
    widths = [max(map(len, col)) for col in columns]
    numeric = [bool(body) and all(map(_is_number, col[1:])) for col in columns]
    head = [_line([str(h) for h in headers], widths, [False] * len(widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(head + [_line(r, widths, numeric) for r in body])


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _line(cells: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)).rstrip()


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", "").split(" ")[0])
    except ValueError:
        return text == "-"
    return True
