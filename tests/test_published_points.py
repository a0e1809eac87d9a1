"""The published benchmark points (tests/data/published_points) and their replay
harness (benchmarks/published_points.py): every row is sourced, parses and resolves
to a kvpool model and GPU; the harness gives finite positive ratios and caps running
requests at the point's concurrency. Whether the ratios are *good* is the step-time
model's business (docs/sim.md), not this file's."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from kvpool import presets

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "published_points"


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("published_points", ROOT / "benchmarks" / "published_points.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


pp = _harness()
POINTS = pp.load_points(DATA / "points.csv")
BY_ID = {p.id: p for p in POINTS}


def test_enough_points_dense_and_moe() -> None:
    assert len(POINTS) >= 24
    moe = {
        p.id
        for p in POINTS
        if p.model in ("llama-4-scout-17b-16e", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b") or "Mixtral" in p.model
    }
    assert len(moe) >= 5 and len(POINTS) - len(moe) >= 10


def test_every_row_has_a_named_source_and_a_place_in_it() -> None:
    readme = (DATA / "README.md").read_text()
    with (DATA / "points.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(POINTS)
    for row in rows:
        assert row["source"].strip(), row["id"]
        assert row["where"].strip(), row["id"]
        # each source key is described (with its URL or repo@commit:path) in the README
        assert f"`{row['source']}`" in readme, row["source"]
    for column in rows[0]:
        assert f"`{column}`" in readme, f"column {column} is not described in README.md"


def test_units_parse_into_positive_seconds() -> None:
    for p in POINTS:
        n = pp.requests_per_rank(p, 3)
        if p.metric == "duration_s":  # every request the source sent, whatever the waves
            assert n == p.num_requests, p.id
        else:
            assert 1 <= n <= p.concurrency // p.dp * 3
        seconds = {"output_tok_s": n * p.osl / (p.measured / p.dp), "duration_s": p.measured}.get(
            p.metric, p.measured / 1000
        )
        assert math.isfinite(seconds) and seconds > 0, p.id
        if p.metric == "batch_latency_ms":  # one batch: its requests all run at once
            assert n == p.concurrency


def test_models_and_gpus_resolve_as_simulate_resolves_them() -> None:
    for p in POINTS:
        presets.load_gpu(p.gpu)
        setup = pp.simulation(p, None)
        assert setup.resolved.limits.max_batch_size == p.concurrency // p.dp, p.id
        assert setup.policies == (pp.ENGINE_POLICY[p.engine],)
        total, active = p.params
        assert 0 < active <= total


def _trtllm_bench_setting(p: Any) -> tuple[int, int]:
    """max_batch_size and max_num_tokens by trtllm-bench's heuristic as README.md states
    it (TensorRT-LLM tensorrt_llm/bench/build/tuning.py), from the preset's config."""
    if p.model.startswith("config:"):
        config = json.loads((pp.CONFIGS / p.model.removeprefix("config:")).read_text())
    else:
        config = presets.load_model_config(p.model)
    text = config.get("text_config", config)
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    layers, kv_heads = text["num_hidden_layers"], text["num_key_value_heads"]
    kv_bytes = 1 if p.kv_dtype == "fp8" else 2
    per_token = 2 * layers * max(p.tp, kv_heads) * head * kv_bytes / 2**30
    # today's tuning.py counts the engine in GiB, TensorRT-LLM 0.17's in GB
    engine = p.params[0] * pp.BYTES_PER_PARAM[p.weights] / (1e9 if p.source == "trtllm-perf-v017" else 2**30)
    memory = round(presets.load_gpu(p.gpu).memory_bytes / 2**30, 2) * p.tp
    requests = (memory - engine) * 0.95 / (per_token * (p.isl + p.osl))
    raw_bs = min(requests, 4096)
    raw_tokens = min(raw_bs * (1 + p.isl / p.osl), 32768)
    step = 32 if raw_bs < 256 else 128 if raw_bs < 1024 else 256
    bs = max(64, step * math.ceil(raw_bs / step))
    tstep = 256 if raw_tokens < 4096 else 512 if raw_tokens < 8192 else 1024
    return bs, max(2048, tstep * math.ceil(raw_tokens / tstep))


def test_unstated_concurrency_is_trtllm_benchs_own_choice() -> None:
    derived = [p for p in POINTS if p.concurrency_source == "trtllm-bench"]
    assert derived
    for p in derived:
        assert _trtllm_bench_setting(p) == (p.concurrency, p.max_num_tokens), p.id


@pytest.mark.parametrize(
    "text, message",
    [
        ({"source": ""}, "column 'source' is empty"),
        ({"measured": "fast"}, "not a number"),
        ({"measured": "-3"}, "positive"),
        ({"metric": "tok/s"}, "metric"),
        ({"concurrency": "0"}, "positive"),
        ({"concurrency": "10", "dp": "8"}, "does not split"),
        ({"metric": "duration_s", "num_requests": ""}, "needs num_requests"),
        ({"weights": "mxfp4", "model": "config:Mixtral-8x7B-v0.1.json"}, "sized from a preset"),
    ],
)
def test_a_bad_row_is_refused_by_line_and_column(text: dict[str, str], message: str) -> None:
    with (DATA / "points.csv").open(newline="") as f:
        row = next(csv.DictReader(f))
    with pytest.raises(pp.PointError, match=message):
        pp.Point.from_row({**row, **text}, 7)


SMALL = [
    "vllm-8b-h200-latency",
    "vllm-mixtral-h200tp2-latency",
    "nim-70b-h100tp2-5000-500-c1",
    "gpustack-oss20b-h100-2k",
]


@pytest.mark.parametrize("point_id", SMALL)
def test_small_points_replay_to_finite_positive_ratios(point_id: str) -> None:
    p = BY_ID[point_id]
    row = pp.replay(p, waves=2)
    assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    assert row["simulated_s"] > 0 and row["measured_s"] > 0
    assert row["ratio"] == pytest.approx(row["simulated_s"] / row["measured_s"])
    assert row["policy"] == pp.ENGINE_POLICY[p.engine]


def test_concurrency_caps_running_requests() -> None:
    # At concurrency 1, requests run one after the other: 3 take 3 times as long as 1
    # (to within the first request's share of a step), never overlapping.
    p = BY_ID["nim-70b-h100tp2-5000-500-c1"]
    one = pp.replay(p, waves=1)["simulated_s"]
    three = pp.replay(p, waves=3)["simulated_s"]
    assert three == pytest.approx(3 * one, rel=0.01)


def test_main_prints_json_rows_and_refuses_unknown_ids(capsys: pytest.CaptureFixture[str]) -> None:
    assert pp.main(["--only", "vllm-8b-h200-latency", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in body["rows"]] == ["vllm-8b-h200-latency"]
    assert body["summary"]["worst"]["id"] == "vllm-8b-h200-latency"
    assert pp.main(["--only", "no-such-point"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-point" in err


def test_vllm_default_concurrency_is_vllms_own() -> None:
    # vLLM's EngineArgs defaults for its API server (engine/arg_utils.py; tests/engine/test_arg_utils.py,
    # test_defaults_with_usage_context): >= 70 GiB and not an A100: 1,024 sequences and 8,192 tokens per
    # step; else 256 and 2,048
    stated = [p for p in POINTS if p.concurrency_source == "vllm-default"]
    assert stated
    for p in stated:
        big = presets.load_gpu(p.gpu).memory_bytes >= 70 * 2**30 and p.gpu != "a100"
        assert (p.concurrency, p.max_num_tokens) == ((1024, 8192) if big else (256, 2048)), p.id


def test_a_duration_point_runs_every_request_sent() -> None:
    p = BY_ID["gpustack-oss20b-h100-2k"]
    row = pp.replay(p)
    assert row["requests_per_rank"] == p.num_requests == 500
    assert row["measured_s"] == p.measured and row["simulated_s"] == row["simulated"]


def test_no_one_front_end_rate_fits_the_short_gpustack_runs() -> None:
    # docs/sim.md: the 128-token runs (1,000 requests of 4 answer tokens sent at once through
    # `vllm bench serve`) of other models on the same harness bound a per-request front-end cost
    # from above (a front end that takes c per request makes N requests last at least N c), and
    # their tightest bound is above what gpt-oss-20b's own run allows, so no rate from them carries over
    short = [p for p in POINTS if p.source == "gpustack-lab" and p.isl <= 128]
    assert all(p.num_requests is not None for p in short)
    per_request = {p.id: p.measured / (p.num_requests or 1) for p in short}
    others = [p.id for p in short if not p.model.startswith("gpt-oss")]
    oss = [p.id for p in short if p.model.startswith("gpt-oss")]
    assert len(others) >= 4 and len(oss) == 4
    tightest_other = min(per_request[i] for i in others)
    assert tightest_other > per_request["gpustack-oss20b-h100-128"]
    assert tightest_other == pytest.approx(8.83 / 984)  # Qwen3-235B on 8 H100: 984 requests in 8.83 s


TEMPLATES = json.loads((DATA / "chat_templates.json").read_text())


def test_gpt_oss_chat_template_is_its_rendered_harmony_tokens() -> None:
    # vLLM renders a gpt-oss chat request with openai-harmony (chat_templates.json, "how"): the count is
    # the rendered ids around the prompt, and those ids are the rendered text's messages, role by role
    (oss,) = [t for t in TEMPLATES["templates"] if "openai/gpt-oss-20b" in t["published_models"]]
    before, after, special = oss["ids_before_prompt"], oss["ids_after_prompt"], oss["special_ids"]
    assert len(before) + len(after) == oss["tokens"] == 69
    ids = [*before, *after]
    for name, token in special.items():
        assert ids.count(token) == oss["rendered"].count(name), name
    starts = [i for i, t in enumerate(ids) if t == special["<|start|>"]]
    # each <|start|> is followed by its role: system, developer, user, then assistant (the id
    # openai/harmony's docs/format.md prints after <|start|> in its example response)
    assert [ids[i + 1] for i in starts] == [17360, 77944, 1428, 173781]
    assert oss["rendered"].index("{prompt}") > oss["rendered"].index("<|start|>user<|message|>")


def test_chat_sources_replay_their_models_template_on_top_of_isl() -> None:
    chat = set(TEMPLATES["chat_sources"])
    assert chat == {"gpustack-lab"}
    # gpt-oss's count as its rendered ids give it (the data file's ids, not its stated total)
    (oss,) = [t for t in TEMPLATES["templates"] if "openai/gpt-oss-20b" in t["published_models"]]
    oss_tokens = len(oss["ids_before_prompt"]) + len(oss["ids_after_prompt"])
    for p in POINTS:
        extra = pp.template_tokens(p)
        assert (extra > 0) == (p.source in chat), p.id
        if p.model.startswith("gpt-oss"):
            assert extra == oss_tokens, p.id
    p = BY_ID["gpustack-oss20b-h100-128"]
    trace = pp.simulation(p, None).trace
    assert set(trace.prompt_len.tolist()) == {p.isl + oss_tokens}
    q = BY_ID["trt-8b-h100-128-2048"]
    assert set(pp.simulation(q, None, waves=1).trace.prompt_len.tolist()) == {q.isl}


def test_a_chat_source_point_without_a_template_is_refused() -> None:
    p = dataclasses.replace(BY_ID["gpustack-qwen3-32b-h100-128"], published_model="Qwen/Qwen3-8B")
    with pytest.raises(pp.PointError, match="no template for Qwen/Qwen3-8B"):
        pp.template_tokens(p)


GiB = 2**30
STARTUPS = {s["id"]: s for s in json.loads((DATA / "vllm_startups.json").read_text())["startups"]}


def _kv_bytes_per_token(config: dict[str, Any]) -> int:
    """K and V of every layer, bf16: the model's own config, not kvpool's spec."""
    layers, kv_heads, head = (int(config[k]) for k in ("num_hidden_layers", "num_key_value_heads", "head_dim"))
    return 2 * layers * kv_heads * head * 2


def test_vllm_at_0_90_cannot_hold_qwen3_32bs_default_limit_on_one_h100() -> None:
    # docs/sim.md: vLLM's budget (gpu_worker.determine_available_memory) is GPU x utilization - weights -
    # the peak of its profiling step - non-torch growth (- its CUDA-graph estimate from v0.21 on). That peak
    # holds at least one MLP's gate/up output for max_num_batched_tokens tokens, so at 0.90 an 80 GB H100
    # is short of the 40,960-token default by vLLM's own arithmetic, as the operators who tried it report.
    # GPUStack's Qwen3-32B runs (vLLM 0.11.0, the same 0.90 and 8,192-token defaults) cannot have started
    # at that limit with the stated command.
    config = presets.load_model_config("qwen3-32b")
    no_start = STARTUPS["llmd-qwen3-32b-h100-v0.26-util0.90-40960"]
    weights = STARTUPS["llmd-qwen3-32b-h100-v0.26-util0.90"]["weights_gib"] * GiB
    gate_up = no_start["max_num_batched_tokens"] * 2 * config["intermediate_size"] * 2
    left = presets.load_gpu("h100").memory_bytes * no_start["gpu_memory_utilization"] - weights - gate_up
    needed = no_start["max_model_len"] * _kv_bytes_per_token(config)
    assert no_start["max_model_len"] == config["max_position_embeddings"]
    assert needed == 10 * GiB
    assert not no_start["starts"] and left < needed


def test_vllm_at_0_90_holds_the_32k_run_of_qwen3_32b_on_one_h100() -> None:
    # what vLLM 0.26.0 allocated at 0.90 (its CUDA graphs already taken out) holds one request of the
    # GPUStack 32K runs (32,000 prompt tokens and the answer), so that run needs no more than the defaults
    config = presets.load_model_config("qwen3-32b")
    started = STARTUPS["llmd-qwen3-32b-h100-v0.26-util0.90"]
    long_run = BY_ID["gpustack-qwen3-32b-h100-32k"]
    assert started["kv_cache_gib"] * GiB >= (long_run.isl + long_run.osl) * _kv_bytes_per_token(config)


# H100 SXM5's streaming multiprocessors (NVIDIA H100 Tensor Core GPU datasheet: 132 SMs)
H100_SMS = 132


def test_kvpool_budget_is_vllms_formula_for_qwen3_32b_on_one_h100(capsys: pytest.CaptureFixture[str]) -> None:
    """kvpool's budget for llm-d's launch against the 8.52 GiB vLLM 0.26.0 allocated.

    vLLM: requested (GPU x 0.90) - weights - its profiling step's torch peak - non-torch
    growth - its CUDA-graph estimate; kvpool: the same terms (plan/memory.py). The
    tolerance is the sum of what the two are known to differ by at this launch, each from
    vLLM's code, none from the published figure: the Triton top-k/top-p buffer vLLM's
    sampler holds and kvpool leaves out (min(SMs, rows) x vocab float32), kvpool's own
    CUDA-graph pool term (the published figures leave vLLM no room for one: docs/sim.md),
    and the two printed roundings (weights and KV, 0.005 GiB each)."""
    from kvpool.cli.main import main

    started = STARTUPS["llmd-qwen3-32b-h100-v0.26-util0.90"]
    argv = ["plan", started["model"], "--gpu", started["gpu"], "--json"]
    argv += ["--gpu-memory-utilization", str(started["gpu_memory_utilization"])]
    argv += ["--max-seq-len", str(started["max_model_len"]), "--max-batch-size", str(started["max_num_seqs"])]
    argv += ["--max-num-tokens", str(started["max_num_batched_tokens"])]
    assert main(argv) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    config = presets.load_model_config(started["model"])
    rows = min(started["max_num_seqs"], started["max_num_batched_tokens"])
    triton_buffer = min(H100_SMS, rows) * config["vocab_size"] * 4
    tolerance = triton_buffer + memory["cuda_graph_bytes"] + 2 * 0.005 * GiB
    assert memory["reserved_bytes"] == 0  # vLLM's formula has no reserve
    assert abs(memory["kv_bytes"] - started["kv_cache_gib"] * GiB) <= tolerance
