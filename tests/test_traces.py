"""Trace readers: bundled traces, each file format, rates, and bad files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvpool.errors import KvpoolError
from kvpool.presets.traces import Trace, TraceError, load_trace, write_mooncake_jsonl
from kvpool.trace import concat_traces


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def assert_arrays(actual: np.ndarray | None, expected: list[float]) -> None:
    assert actual is not None, "expected arrival times, got None"
    assert np.allclose(actual, expected), f"got {actual.tolist()}, expected {expected}"


# ----------------------------------------------------------------------------- bundled


@pytest.mark.parametrize(
    ("name", "rows", "first"),
    [
        # Row counts and first rows from the traces README / the files' first lines.
        ("azure-conv", 19366, (374, 44)),
        ("azure-code", 8819, (4808, 10)),
        ("mooncake-conv", 12031, (6758, 500)),
    ],
)
def test_bundled_traces_load(name: str, rows: int, first: tuple[int, int]) -> None:
    trace = load_trace(name)
    assert len(trace) == rows
    assert (int(trace.prompt_len[0]), int(trace.output_len[0])) == first
    assert trace.arrival_s is not None and trace.arrival_s[0] == 0.0
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.prompt_len.min() >= 1 and trace.output_len.min() >= 1


def same_trace(a: Trace, b: Trace) -> None:
    assert a.prompt_len.tolist() == b.prompt_len.tolist() and a.output_len.tolist() == b.output_len.tolist()
    assert a.hash_ids == b.hash_ids and a.hash_block_tokens == b.hash_block_tokens
    assert (a.arrival_s is None) == (b.arrival_s is None)
    if a.arrival_s is not None and b.arrival_s is not None:
        assert np.allclose(a.arrival_s, b.arrival_s, rtol=1e-12, atol=0)


def test_mooncake_jsonl_written_reads_back(tmp_path: Path) -> None:
    # the bundled trace's whole-millisecond times come back exactly; a mix's re-timed ones to rounding
    head = load_trace("mooncake-conv", max_requests=300)
    write_mooncake_jsonl(head, tmp_path / "head.jsonl")
    back = load_trace(tmp_path / "head.jsonl")
    same_trace(back, head)
    assert back.arrival_s is not None and head.arrival_s is not None
    assert back.arrival_s.tolist() == head.arrival_s.tolist()
    # the first line as the bundled file has it (integer milliseconds)
    first = (tmp_path / "head.jsonl").read_text().splitlines()[0]
    assert first.startswith('{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2')
    mix = concat_traces([head, load_trace("azure-conv", max_requests=40), head.head(25)])
    write_mooncake_jsonl(mix, tmp_path / "mix.jsonl")
    same_trace(load_trace(tmp_path / "mix.jsonl"), mix)


def test_mooncake_jsonl_needs_512_token_blocks(tmp_path: Path) -> None:
    trace = Trace("t", np.array([600]), np.array([5]), None, ((1, 2),), hash_block_tokens=300)
    with pytest.raises(TraceError, match="512 tokens"):
        write_mooncake_jsonl(trace, tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


def test_azure_timestamps_are_seconds_from_first_request() -> None:
    trace = load_trace("azure-conv", max_requests=2)
    # 18:15:50.9951690 - 18:15:46.6805900 = 4.314579 s
    assert_arrays(trace.arrival_s, [0.0, 4.314579])


def test_mooncake_hash_ids_cover_prompt_in_512_token_blocks() -> None:
    trace = load_trace("mooncake-conv", max_requests=50)
    assert trace.hash_ids is not None and trace.hash_block_tokens == 512
    for p, ids in zip(trace.prompt_len.tolist(), trace.hash_ids, strict=True):
        assert len(ids) == -(-p // 512), (p, len(ids))
    # the first two requests share their first block (hash 0): a reusable prefix
    assert trace.hash_ids[0][0] == trace.hash_ids[1][0] == 0


# ----------------------------------------------------------------------------- formats


def test_plain_csv_with_header_and_arrivals(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "prompt_len,output_len,arrival_s\n10,5,2.5\n20,1,0.5\n")
    trace = load_trace(path)
    # sorted by arrival, times relative to the first: 0.5 -> 0, 2.5 -> 2.0
    assert trace.prompt_len.tolist() == [20, 10] and trace.output_len.tolist() == [1, 5]
    assert_arrays(trace.arrival_s, [0.0, 2.0])
    assert trace.name == "t"


def test_plain_csv_without_header(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "t.csv", "7,3\n8,4\n"))
    assert trace.lengths() == [(7, 3), (8, 4)]
    assert trace.arrival_s is None


def test_length_only_csv(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "l.csv", "ContextTokens,GeneratedTokens\n100,9\n"))
    assert trace.lengths() == [(100, 9)] and trace.arrival_s is None


def test_burstgpt_style_columns(tmp_path: Path) -> None:
    text = "Timestamp,Model,Request tokens,Response tokens\n5,gpt,30,2\n7,gpt,40,3\n"
    trace = load_trace(write(tmp_path, "b.csv", text))
    assert trace.lengths() == [(30, 2), (40, 3)]
    assert_arrays(trace.arrival_s, [0.0, 2.0])


def test_vidur_processed_trace_columns() -> None:
    # Vidur's processed traces: num_prefill_tokens, num_decode_tokens and two derived
    # columns; the held-out arXiv trace's first row is 3772 prompt / 54 output tokens
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "traces" / "arxiv_summarization.csv"
    t = load_trace(path)
    assert len(t) == 28257 and t.arrival_s is None
    assert (int(t.prompt_len[0]), int(t.output_len[0])) == (3772, 54)
    assert int((t.prompt_len + t.output_len).max()) == 4096  # filtered to 4,096 tokens a request


def test_jsonl_without_hashes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.jsonl",
        '{"timestamp": 1000, "input_length": 3, "output_length": 2}\n'
        '{"timestamp": 2500, "input_length": 4, "output_length": 1}\n',
    )
    trace = load_trace(path)
    assert trace.hash_ids is None
    assert_arrays(trace.arrival_s, [0.0, 1.5])  # milliseconds


# ----------------------------------------------------------------------------- rates


def make(n: int, times: list[float] | None) -> Trace:
    return Trace(
        "t",
        np.full(n, 10, dtype=np.int64),
        np.full(n, 2, dtype=np.int64),
        None if times is None else np.asarray(times, dtype=np.float64),
    )


def test_rate_rescales_trace_times() -> None:
    # 4 requests over 2 s = 2 req/s observed; at rate 8 they span 4 / 8 = 0.5 s
    trace = make(4, [0.0, 1.0, 1.5, 2.0]).with_rate(8.0)
    assert_arrays(trace.arrival_s, [0.0, 0.25, 0.375, 0.5])


def test_rate_inf_sends_everything_at_zero() -> None:
    assert_arrays(make(3, [0.0, 1.0, 2.0]).with_rate(math.inf).arrival_s, [0.0, 0.0, 0.0])


def test_rate_without_times_is_seeded_poisson() -> None:
    a = make(20000, None).with_rate(4.0, seed=1)
    b = make(20000, None).with_rate(4.0, seed=1)
    assert a.arrival_s is not None and b.arrival_s is not None
    assert np.array_equal(a.arrival_s, b.arrival_s)
    mean_gap = float(np.diff(a.arrival_s).mean())
    assert abs(mean_gap - 0.25) < 0.01, mean_gap  # exponential gaps of mean 1/4 s


def test_default_rate_without_times_is_offline() -> None:
    assert_arrays(make(2, None).with_rate(None).arrival_s, [0.0, 0.0])


def test_head_keeps_first_requests() -> None:
    trace = make(5, [0, 1, 2, 3, 4]).head(2)
    assert len(trace) == 2
    assert_arrays(trace.arrival_s, [0.0, 1.0])


def test_span_is_a_range_retimed_from_its_first_arrival() -> None:
    trace = make(5, [0, 1, 3, 6, 10])
    part = trace.span(2, 4)
    assert len(part) == 2 and part.name == f"{trace.name} [2:4]"
    assert_arrays(part.arrival_s, [0.0, 3.0])  # 3 and 6, less 3
    assert part.prompt_len.tolist() == trace.prompt_len[2:4].tolist()
    assert trace.span(0, 5, "all").name == "all"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("e.csv", "", "empty"),
        ("h.csv", "prompt_len,output_len\n", "no requests"),
        ("c.csv", "a,b\n1,2\n", "names no prompt-length"),
        ("n.csv", "prompt_len,output_len\n10,x\n", ":2: output length"),
        ("z.csv", "prompt_len,output_len\n0,5\n", "at least 1"),
        ("f.csv", "prompt_len,output_len\n1.5,5\n", "whole number"),
        ("s.csv", "prompt_len,output_len\n5\n", "expected at least 2 columns"),
        ("w.csv", "1,2,3,4\n", "headerless"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "cannot read time"),
        ("j.jsonl", "{not json\n", "not valid JSON"),
        ("k.jsonl", '{"input_length": 3}\n', "needs input_length and output_length"),
        ("m.jsonl", '{"input_length": 1000, "output_length": 1, "hash_ids": [1]}\n', "expected ceil"),
        ("x.jsonl", '{"input_length": 3, "output_length": 1, "hash_ids": ["a"]}\n', "list of integers"),
    ],
)
def test_bad_files_raise_trace_error(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message) as info:
        load_trace(write(tmp_path, name, text))
    assert isinstance(info.value, KvpoolError)


def test_missing_file_and_unknown_name() -> None:
    with pytest.raises(TraceError, match="neither a bundled trace"):
        load_trace("azure-chat-does-not-exist")


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan])
def test_bad_rate(rate: float) -> None:
    with pytest.raises(TraceError, match="rate must be positive"):
        make(2, None).with_rate(rate)


def test_error_line_numbers_count_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", "prompt_len,output_len\n100,10\n\n\n200,x\n")
    with pytest.raises(TraceError, match=r"b\.csv:5: output length"):
        load_trace(path)


def test_excel_bom_and_trailing_commas(tmp_path: Path) -> None:
    bom = write(tmp_path, "bom.csv", "\ufeffprompt_len,output_len\n100,10\n")
    assert load_trace(bom).prompt_len.tolist() == [100]
    trailing = write(tmp_path, "t.csv", "100,10,\n200,20,\n")
    assert load_trace(trailing).output_len.tolist() == [10, 20]
    jsonl = write(tmp_path, "bom.jsonl", '\ufeff{"input_length": 5, "output_length": 2}\n')
    assert load_trace(jsonl).prompt_len.tolist() == [5]


def test_millisecond_columns_and_unknown_time_columns(tmp_path: Path) -> None:
    ms = write(tmp_path, "ms.csv", "prompt_len,output_len,arrival_ms\n100,10,0\n200,20,5000\n")
    assert_arrays(load_trace(ms).arrival_s, [0.0, 5.0])
    odd = write(tmp_path, "odd.csv", "prompt_len,output_len,arrival_minutes\n100,10,0\n")
    with pytest.raises(TraceError, match="looks like a time"):
        load_trace(odd)


def test_utc_offset_timestamps_convert_quietly(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    path = write(
        tmp_path,
        "tz.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.5+00:00,100,10\n2024-05-10 00:00:02+00:00,200,20\n",
    )
    assert_arrays(load_trace(path).arrival_s, [0.0, 1.5])
    assert not [w for w in recwarn if "timezone" in str(w.message)]
