"""Request traces: (prompt length, output length, arrival time, prefix blocks).

`load_trace` reads the bundled traces by name (`azure-conv`, `azure-code`,
`mooncake-conv`), a shifting mix of them (`azure-conv:600+mooncake-conv:300`:
the first 600 chat requests, then the first 300 Mooncake ones, see
`kvpool.trace.concat_traces`), or a file in one of these formats, told apart
by extension and header:

- Azure LLM inference trace 2023 CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`
  (absolute wall-clock timestamps such as `2023-11-16 18:15:46.6805900`);
- Mooncake JSONL: one object per line with `timestamp` (milliseconds),
  `input_length`, `output_length` and `hash_ids` (prefix-block hashes of 512
  tokens each; equal ids mean a reusable prefix block);
- a length-only CSV: any header naming a prompt and an output column
  (`ContextTokens`/`GeneratedTokens`, `input_length`/`output_length`,
  `Request tokens`/`Response tokens`, Vidur's `num_prefill_tokens`/`num_decode_tokens`,
  ...) and no time column;
- a plain CSV `prompt_len,output_len[,arrival_s]`, with or without that header.

In a CSV a numeric `timestamp` / `time` column is seconds (name it
`arrival_ms` or `timestamp_ms` for milliseconds; a date-time string is read as
wall-clock time); Mooncake JSONL `timestamp` is milliseconds, as that trace
defines it. A column that looks like a time but is none of these is refused
rather than ignored.

Arrival times are seconds relative to the first request; rows are sorted by
arrival (stable, so equal times keep file order). Bad files raise `TraceError`
(a `KvpoolError`) naming the file and line.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvpool import jsonsafe
from kvpool.trace import MOONCAKE_BLOCK_TOKENS, Trace, TraceError, concat_traces

__all__ = ["MOONCAKE_BLOCK_TOKENS", "Trace", "TraceError", "load_trace", "write_mooncake_jsonl"]

# Traces are read whole into arrays; past this size the lists of a CSV reader
# alone take several GB (the bundled traces are a few MB).
MAX_TRACE_BYTES = 512 * 2**20
# Token counts past int32 are no real request, and overflow the simulator's int64 sums.
MAX_REQUEST_TOKENS = 2**31 - 1

# Header spellings (lower-cased, spaces/dashes as underscores) per column role.
_PROMPT = (
    "prompt_len",
    "prompt_length",
    "prompt_tokens",
    "input_len",
    "input_length",
    "input_tokens",
    "contexttokens",
    "context_tokens",
    "request_tokens",
    "num_prefill_tokens",
)
_OUTPUT = (
    "output_len",
    "output_length",
    "output_tokens",
    "generatedtokens",
    "generated_tokens",
    "response_tokens",
    "completion_tokens",
    "num_decode_tokens",
)
# time column -> unit: seconds, milliseconds, or "datetime" (absolute wall clock string)
_TIME = {
    "arrival_s": "s",
    "arrival_time": "s",
    "arrival_time_s": "s",
    "time_s": "s",
    "timestamp_s": "s",
    "arrival_ms": "ms",
    "arrival_time_ms": "ms",
    "time_ms": "ms",
    "timestamp_ms": "ms",
    "timestamp": "auto",
    "time": "auto",
}


def load_trace(name_or_path: str | Path, *, max_requests: int | None = None) -> Trace:
    """Read a bundled trace by name or a trace file (formats: module docstring).
    `max_requests` keeps the first N requests in arrival order. Raises TraceError."""
    from kvpool.presets import TRACES, trace_path

    text = str(name_or_path)
    if "+" in text and not Path(text).is_file():
        return concat_traces([_part(p) for p in text.split("+")], text).head(max_requests)
    if text.lower() in TRACES:
        path, name = trace_path(text), text.lower()
    else:
        path, name = Path(text), Path(text).stem
        if not path.is_file():
            raise TraceError(f"trace {text!r} is neither a bundled trace ({', '.join(TRACES)}) nor a file")
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(
                f"trace {path} is {size / 2**30:.1f} GiB, over the {MAX_TRACE_BYTES // 2**20} MiB kvpool reads whole: "
                f"cut it first (e.g. head -n 1000001 {path} > part{path.suffix})"
            )
        with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: Excel's BOM
            if path.suffix.lower() in (".jsonl", ".json"):
                trace = _read_jsonl(f.read().splitlines(), name, path)
            else:
                trace = _read_csv(list(csv.reader(f)), name, path)
    except UnicodeDecodeError as e:
        raise TraceError(f"trace {path} is not UTF-8 text: {e}") from None
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    return trace.head(max_requests)


def write_mooncake_jsonl(trace: Trace, path: str | Path) -> None:
    """Write `trace` as Mooncake JSONL (`timestamp` in milliseconds,
    `input_length`, `output_length`, `hash_ids`), the format Dynamo's mocker and
    `load_trace` read: loading the file gives the same trace back (times that
    were whole milliseconds exactly). Raises TraceError for prefix blocks of
    another size than Mooncake's 512 tokens."""
    if trace.hash_ids is not None and trace.hash_block_tokens != MOONCAKE_BLOCK_TOKENS:
        raise TraceError(
            f"trace {trace.name}: Mooncake hash_ids cover {MOONCAKE_BLOCK_TOKENS} tokens, "
            f"this trace's {trace.hash_block_tokens}"
        )
    times = None if trace.arrival_s is None else (trace.arrival_s * 1000.0).tolist()
    with Path(path).open("w", encoding="utf-8") as f:
        for i, (prompt, output) in enumerate(trace.lengths()):
            row: dict[str, object] = {}
            if times is not None:
                ms = times[i]
                row["timestamp"] = round(ms) if abs(ms - round(ms)) < 1e-6 else ms  # whole ms stay integers
            row["input_length"], row["output_length"] = prompt, output
            if trace.hash_ids is not None:
                row["hash_ids"] = list(trace.hash_ids[i])
            f.write(json.dumps(row) + "\n")


def _part(text: str) -> Trace:
    """`NAME[:N]` of a mix: a bundled trace or file, its first N requests."""
    name, sep, count = text.strip().rpartition(":")
    if not sep or not count.isdigit():
        return load_trace(text.strip())
    if int(count) < 1:
        raise TraceError(f"trace part {text!r}: the request count must be positive")
    return load_trace(name, max_requests=int(count))


def _key(header: str) -> str:
    return header.strip().lower().replace(" ", "_").replace("-", "_")


def _int(value: object, path: Path, line: int, column: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value) if isinstance(value, str) else value
        if not isinstance(number, int | float) or not math.isfinite(number) or not float(number).is_integer():
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{path}:{line}: {column} must be a whole number, got {_shown(value)}") from None
    if number < 1:
        raise TraceError(f"{path}:{line}: {column} must be at least 1, got {_shown(value)}")
    if number > MAX_REQUEST_TOKENS:  # compared before int(): 1e300 would print 300 digits
        raise TraceError(f"{path}:{line}: {column} {_shown(value)} is implausibly long (more than 2**31 - 1 tokens)")
    return int(number)


def _shown(value: object) -> str:
    """A cell as an error shows it: its repr, cut at 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _seconds(value: str, unit: str, path: Path, line: int) -> float:
    """A time cell as seconds (datetime strings as seconds since the epoch)."""
    try:
        seconds = float(value) / (1000.0 if unit == "ms" else 1.0)
    except ValueError:
        try:
            with warnings.catch_warnings():  # a UTC offset is applied; numpy only warns
                warnings.simplefilter("ignore")
                stamp = np.datetime64(value.strip().replace(" ", "T"), "ns")
        except ValueError:
            raise TraceError(f"{path}:{line}: cannot read time {_shown(value)}") from None
        seconds = float(stamp.astype(np.int64)) / 1e9
    if not math.isfinite(seconds):
        raise TraceError(f"{path}:{line}: time {_shown(value)} is not finite")
    return seconds


def _finish(
    name: str,
    prompt: list[int],
    output: list[int],
    times: list[float] | None,
    hashes: list[tuple[int, ...]] | None,
    path: Path,
) -> Trace:
    if not prompt:
        raise TraceError(f"trace {path} has no requests")
    order = np.argsort(np.asarray(times), kind="stable") if times is not None else None
    p, o = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    arrival = None
    if times is not None and order is not None:
        t = np.asarray(times, dtype=np.float64)[order]
        arrival = t - t[0]
        p, o = p[order], o[order]
        if hashes is not None:
            hashes = [hashes[i] for i in order.tolist()]
    return Trace(name, p, o, arrival, tuple(hashes) if hashes is not None else None)


def _read_csv(rows: Sequence[Sequence[str]], name: str, path: Path) -> Trace:
    numbered = [(i + 1, _trim(r)) for i, r in enumerate(rows) if any(c.strip() for c in r)]
    if not numbered:
        raise TraceError(f"trace {path} is empty")
    lines, rows = [n for n, _ in numbered], [r for _, r in numbered]
    header = [_key(c) for c in rows[0]]
    if all(_is_number(c) for c in rows[0]):  # headerless plain CSV
        if len(header) not in (2, 3):
            raise TraceError(f"{path}:1: a headerless trace needs prompt_len,output_len[,arrival_s]")
        cols: dict[str, int | None] = {"prompt": 0, "output": 1, "time": 2 if len(header) == 3 else None}
        unit, data_start = "s", 0
    else:

        def find(names: Sequence[str]) -> int | None:
            return next((i for i, h in enumerate(header) if h in names), None)

        cols = {"prompt": find(_PROMPT), "output": find(_OUTPUT), "time": find(tuple(_TIME))}
        if cols["prompt"] is None or cols["output"] is None:
            raise TraceError(
                f"{path}:1: header {rows[0]} names no prompt-length and output-length columns "
                "(e.g. prompt_len,output_len[,arrival_s] or TIMESTAMP,ContextTokens,GeneratedTokens)"
            )
        time_col = cols["time"]
        timeish = [c for c, h in zip(rows[0], header, strict=True) if "time" in h or "arrival" in h]
        if time_col is None and timeish:
            raise TraceError(
                f"{path}:1: column {timeish[0]!r} looks like a time but is not one kvpool "
                f"reads; name it arrival_s or arrival_ms (or timestamp, in seconds)"
            )
        unit = _TIME[header[time_col]] if time_col is not None else "s"
        data_start = 1
    prompt: list[int] = []
    output: list[int] = []
    times: list[float] | None = [] if cols["time"] is not None else None
    width = max(c for c in cols.values() if c is not None) + 1
    for line, row in zip(lines[data_start:], rows[data_start:], strict=True):
        if len(row) < width:
            raise TraceError(f"{path}:{line}: expected at least {width} columns, got {len(row)}")
        prompt.append(_int(row[cols["prompt"] or 0], path, line, "prompt length"))
        output.append(_int(row[cols["output"] or 0], path, line, "output length"))
        if times is not None and cols["time"] is not None:
            times.append(_seconds(row[cols["time"]], unit, path, line))
    return _finish(name, prompt, output, times, None, path)


def _trim(row: Sequence[str]) -> list[str]:
    """A CSV row without empty trailing cells (`100,10,` is two cells)."""
    cells = list(row)
    while cells and not cells[-1].strip():
        cells.pop()
    return cells


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_jsonl(lines: Sequence[str], name: str, path: Path) -> Trace:
    prompt: list[int] = []
    output: list[int] = []
    times: list[float] = []
    hashes: list[tuple[int, ...]] = []
    has_time = has_hash = None
    for k, text in enumerate(lines):
        line = k + 1
        if not text.strip():
            continue
        try:
            obj = jsonsafe.loads(text, caller_bounds_ints=True)  # _int and the hash_ids check bound each
        except jsonsafe.JSONValueError as e:
            raise TraceError(f"{path}:{line}: {e}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}:{line}: expected a JSON object")
        keys = {_key(key): value for key, value in obj.items()}
        p_key = next((c for c in _PROMPT if c in keys), None)
        o_key = next((c for c in _OUTPUT if c in keys), None)
        if p_key is None or o_key is None:
            raise TraceError(f"{path}:{line}: needs input_length and output_length fields")
        prompt.append(_int(keys[p_key], path, line, p_key))
        output.append(_int(keys[o_key], path, line, o_key))
        t_key = "timestamp" if "timestamp" in keys else next((c for c in _TIME if c in keys), None)
        if has_time is None:
            has_time, has_hash = t_key is not None, "hash_ids" in keys
        if has_time != (t_key is not None) or has_hash != ("hash_ids" in keys):
            raise TraceError(f"{path}:{line}: fields differ from the first request's")
        if t_key is not None:
            # Mooncake's `timestamp` is in milliseconds; `*_s` keys are seconds.
            unit = "ms" if t_key in ("timestamp", "timestamp_ms") else "s"
            times.append(_seconds(str(keys[t_key]), unit, path, line))
        if "hash_ids" in keys:
            ids = keys["hash_ids"]
            if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < 2**63 for i in ids):
                raise TraceError(f"{path}:{line}: hash_ids must be a list of integers in [0, 2**63)")
            if len(ids) != -(-prompt[-1] // MOONCAKE_BLOCK_TOKENS):
                raise TraceError(
                    f"{path}:{line}: {len(ids)} hash_ids for {prompt[-1]} prompt tokens; expected "
                    f"ceil({prompt[-1]}/{MOONCAKE_BLOCK_TOKENS}) = {-(-prompt[-1] // MOONCAKE_BLOCK_TOKENS)}"
                )
            hashes.append(tuple(ids))
    return _finish(name, prompt, output, times if has_time else None, hashes if has_hash else None, path)
