"""Pipeline and data-parallel attention in the KV spec and on the command
line: one rank's layers and heads, checked against hand counts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool import load_model_spec
from kvpool.errors import KvpoolError, SpecError


def layers_of(spec: Any) -> list[int]:
    return sorted(i for g in spec.groups for i in g.layers)


def test_gemma3_stages_follow_vllms_split_and_the_busiest_is_planned() -> None:
    """62 layers over 4 stages as vLLM's get_pp_indices splits them: 15, 16, 16, 15
    (the 2 extra layers go to the stages before the last). Globals are layers
    5, 11, ..., 59 ((i + 1) % 6 == 0): stage 0 (0..14) holds 2, stage 1 (15..30) 3,
    stage 2 (31..46) 3, stage 3 (47..61) 2. A full layer costs a 2049-token
    request 65 pages, a 1024-window sliding one 33, so stage 1 (3 full + 13
    sliding) needs the most and wins the tie with stage 2 by coming first."""
    spec = load_model_spec("gemma-3-27b", pp_size=4)
    assert spec.pp_stage == (1, 4)
    assert layers_of(spec) == list(range(15, 31))
    assert {g.name: len(g.layers) for g in spec.groups} == {"sliding": 13, "full": 3}


@settings(max_examples=30, deadline=None)
@given(pp=st.integers(1, 12))
def test_a_stage_is_a_slice_of_the_whole_model(pp: int) -> None:
    whole = load_model_spec("gemma-3-27b")
    stage = load_model_spec("gemma-3-27b", pp_size=pp)
    mine = layers_of(stage)
    assert mine == list(range(mine[0], mine[-1] + 1))  # contiguous
    assert 62 // pp <= len(mine) <= -(-62 // pp)  # as even as the split allows
    by_layer = {i: g for g in whole.groups for i in g.layers}
    for g in stage.groups:  # every layer keeps its kind and its bytes per row
        for i in g.layers:
            assert (by_layer[i].kind, by_layer[i].window) == (g.kind, g.window)
            assert by_layer[i].row_bytes // len(by_layer[i].layers) == g.row_bytes // len(g.layers)


def test_more_stages_than_layers_or_a_bad_size_is_refused() -> None:
    with pytest.raises(KvpoolError, match="more stages"):
        load_model_spec("gemma-3-27b", pp_size=63)
    with pytest.raises(SpecError, match="pp_size"):
        load_model_spec("gemma-3-27b", pp_size=0)


def test_cli_dp_attention_splits_kv_over_tp_over_dp(cli: Any) -> None:
    """llama-3.1-8b (8 KV heads of 128, 32 layers, bf16): --tp 8 gives a rank
    1 KV head; --tp 8 --dp 4 splits attention over 8 / 4 = 2 ranks, 4 heads."""
    rows = {}
    for argv in (["--tp", "8"], ["--tp", "8", "--dp", "4"]):
        code, out, err = cli("inspect", "llama-3.1-8b-instruct", *argv, "--json")
        assert code == 0, err
        data = json.loads(out)
        rows[len(argv)] = data["groups"][0]["page_bytes"]  # 32 positions per page
    assert rows[2] == 32 * 32 * 2 * 1 * 128 * 2
    assert rows[4] == 32 * 32 * 2 * 4 * 128 * 2


def test_cli_pp_plans_one_stage_and_splits_the_weights(cli: Any) -> None:
    code, out, err = cli("plan", "llama-3.1-70b", "--gpu", "h100", "--tp", "4", "--max-seq-len", "8192", "--json")
    code2, out2, err2 = cli(
        "plan", "llama-3.1-70b", "--gpu", "h100", "--tp", "4", "--pp", "2", "--max-seq-len", "8192", "--json"
    )
    assert code == code2 == 0, err + err2
    one, two = json.loads(out), json.loads(out2)
    # 80 layers: a stage keeps 40, half the KV bytes per page ...
    assert two["groups"][0]["page_bytes"] * 2 == one["groups"][0]["page_bytes"]
    # ... and about half the weights (embeddings on the first stage, lm_head on the last)
    assert 0.45 < two["memory"]["weights_bytes"] / one["memory"]["weights_bytes"] < 0.55


@pytest.mark.parametrize("argv", [["--tp", "4", "--dp", "3"], ["--tp", "4", "--ep", "3"]])
def test_cli_dp_or_ep_must_divide_tp(cli: Any, argv: list[str]) -> None:
    code, _, err = cli("inspect", "llama-3.1-8b-instruct", *argv)
    assert code == 2 and "must divide --tp 4" in err


def test_emit_states_the_whole_layout(cli: Any) -> None:
    """The launch line carries pipeline parallelism too (it used to be refused):
    vLLM's --pipeline-parallel-size beside the TP size."""
    code, out, err = cli("plan", "llama-3.1-70b", "--kv-memory", "10GiB", "--tp", "4", "--pp", "2", "--emit", "vllm")
    assert code == 0, err
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 2" in out
