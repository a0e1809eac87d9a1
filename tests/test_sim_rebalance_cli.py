"""Shifting traces (`A:N+B:M`) and `kvpool simulate --policy rebalance`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.presets.traces import load_trace
from kvpool.trace import MOONCAKE_BLOCK_TOKENS, Trace, TraceError, concat_traces

BASE = ["--gpu", "h100", "--kv-memory", "2GiB", "--max-seq-len", "4096", "--max-batch-size", "32"]
ARGS = [*BASE, "--max-num-tokens", "2048", "--rate", "inf", "--quiet"]


def shifting_file(tmp_path: Path) -> str:
    """40 short chats then 40 prompts of about 3k tokens, as a plain CSV."""
    rows = [f"{100 + 7 * i},{20 + i % 30}" for i in range(40)] + [f"{2800 + 5 * i},{30 + i % 20}" for i in range(40)]
    path = tmp_path / "shift.csv"
    path.write_text("prompt_len,output_len\n" + "\n".join(rows) + "\n")
    return str(path)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 6), st.booleans(), st.booleans()),  # requests, timed, hashed
        min_size=1,
        max_size=4,
    )
)
def test_concatenated_parts_keep_their_rows_and_never_share_fresh_blocks(parts: list[tuple[int, bool, bool]]) -> None:
    rng = np.random.default_rng(len(parts))
    traces = []
    for k, (n, timed, hashed) in enumerate(parts):
        prompts = rng.integers(1, 2000, n)
        times = np.sort(rng.uniform(0, 10, n)) if timed else None
        hashes = tuple(tuple(range(100 * k, 100 * k + -(-int(p) // MOONCAKE_BLOCK_TOKENS))) for p in prompts)
        traces.append(Trace(f"t{k}", prompts, rng.integers(1, 50, n), times, hashes if hashed else None))
    out = concat_traces(traces)
    assert out.prompt_len.tolist() == [x for t in traces for x in t.prompt_len.tolist()]
    assert out.output_len.tolist() == [x for t in traces for x in t.output_len.tolist()]
    if any(timed for _, timed, _ in parts):
        assert out.arrival_s is not None and out.arrival_s[0] == 0 and (np.diff(out.arrival_s) >= 0).all()
    else:
        assert out.arrival_s is None
    if not any(hashed for _, _, hashed in parts):
        assert out.hash_ids is None
        return
    assert out.hash_ids is not None
    given_ids = {i for t in traces if t.hash_ids is not None for h in t.hash_ids for i in h}
    k = 0
    for t in traces:
        for row in range(len(t)):
            ids = out.hash_ids[k]
            assert len(ids) == -(-int(t.prompt_len[row]) // MOONCAKE_BLOCK_TOKENS)
            if t.hash_ids is None:  # fresh blocks: unique, and unlike any given id
                assert not set(ids) & given_ids
            k += 1
    fresh = [i for t, ids in zip(traces, _rows(out, traces), strict=True) if t.hash_ids is None for h in ids for i in h]
    assert len(fresh) == len(set(fresh))


def _rows(out: Trace, traces: list[Trace]) -> list[tuple[tuple[int, ...], ...]]:
    assert out.hash_ids is not None
    starts = np.cumsum([0] + [len(t) for t in traces])
    return [out.hash_ids[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def test_a_mix_spec_is_the_first_rows_of_each_part_in_order() -> None:
    mix = load_trace("azure-conv:5+mooncake-conv:3")
    chat, moon = load_trace("azure-conv", max_requests=5), load_trace("mooncake-conv", max_requests=3)
    assert mix.prompt_len.tolist() == chat.prompt_len.tolist() + moon.prompt_len.tolist()
    assert mix.hash_ids is not None and mix.hash_ids[5:] == moon.hash_ids
    assert mix.arrival_s is not None and chat.arrival_s is not None and moon.arrival_s is not None
    assert mix.arrival_s[:5].tolist() == chat.arrival_s.tolist()  # the chat part first, its own times
    assert mix.arrival_s[5] >= mix.arrival_s[4]
    assert np.allclose(mix.arrival_s[5:] - mix.arrival_s[5], moon.arrival_s)
    assert len(load_trace("azure-conv:5+azure-code:4", max_requests=7)) == 7
    for bad in ("azure-conv:0+azure-code:3", "azure-conv:3+nope:2"):
        with pytest.raises(TraceError):
            load_trace(bad)


def test_rebalance_run_reports_moves_and_pages_moved(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trace = shifting_file(tmp_path)
    code, out, err = cli(
        "simulate", "gemma-3-27b", *ARGS, "--trace", trace, "--compare", "reference,rebalance", "--json"
    )
    assert code == 0, err
    ref, reb = json.loads(out)["runs"]
    assert "rebalance" not in ref and reb["policy"] == "rebalance"
    log = reb["rebalance"]
    assert log["group"] == "sliding" and not log["dry_run"] and log["moves"] == len(log["log"]) >= 1
    assert log["pages_moved"]["sliding"] == sum(abs(m["moved"]["sliding"]) for m in log["log"]) > 0
    code, text, err = cli("simulate", "gemma-3-27b", *ARGS, "--trace", trace, "--policy", "rebalance")
    assert code == 0, err
    line = next(x for x in text.splitlines() if x.startswith("rebalance:"))
    assert f"{log['moves']} moves" in line and f"{log['pages_moved']['sliding']:,} sliding" in line


def test_dry_run_keeps_the_split_and_says_what_it_would_move(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trace = shifting_file(tmp_path)
    code, out, err = cli(
        "simulate", "gemma-3-27b", *ARGS, "--trace", trace, "--compare", "reference,rebalance", "--dry-run", "--json"
    )
    assert code == 0, err
    ref, dry = json.loads(out)["runs"]
    assert dry["policy"] == "rebalance (dry run)" and dry["rebalance"]["dry_run"] and dry["rebalance"]["moves"] >= 1
    assert all(dry["pages"][g]["total"] == ref["pages"][g]["total"] for g in ("sliding", "full"))
    assert dry["output_tokens_per_s"] == pytest.approx(ref["output_tokens_per_s"], rel=1e-9)


def test_rebalance_of_a_model_without_a_sliding_group_is_one_line_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("simulate", "qwen3-0.6b", *ARGS, "--trace", shifting_file(tmp_path), "--policy", "rebalance")
    assert code == 2 and "one sliding and one full" in err and len(err.strip().splitlines()) == 1
