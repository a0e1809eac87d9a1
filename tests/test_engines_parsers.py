"""The emitted launch lines go through the engines' own parsers: vLLM 0.33's and
0.32's `vllm serve` parser and `EngineArgs`, SGLang 0.5.23's `ServerArgs`, each in
its side venv (tests/engines_truth/parsers_runner.py), so that a line kvpool
prints is one the engine starts with the layout (TP, PP, DP attention, EP) and
budget the plan says. TensorRT-LLM's wheels are CUDA-only: its YAML is checked
against the LLM API's fields transcribed in tests/data/trtllm/llm_args_schema.json.

Without the side venvs these tests skip, unless KVPOOL_ENGINES_REQUIRED=1 (`make test`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from engines_truth.lane import HERE, VLLM_RELEASES, engine_python, run_engine
from kvpool import ServingLimits, load_model_spec, plan_pools
from kvpool.engines.emit import Emitted, emit
from kvpool.models.weights import Parallel
from kvpool.plan import PoolPlan

SCHEMA = Path(__file__).parent / "data" / "trtllm" / "llm_args_schema.json"
# (model, kv dtype, max_seq_len, avg_seq_len, layout)
CASES = [
    ("gpt-oss-20b", "auto", 32768, None, Parallel()),
    ("gemma-3-27b", "fp8", 16384, 4096, Parallel(tp=2)),
    ("qwen3-next-80b-a3b", "auto", 8192, None, Parallel(tp=4)),
    ("qwen3-32b", "auto", 32768, None, Parallel(tp=2)),  # what `kvpool fit qwen3-32b --gpu h100x2` launches
    ("qwen3-32b", "auto", 32768, None, Parallel(tp=4, pp=2)),
    ("gpt-oss-120b", "auto", 32768, None, Parallel(tp=8, ep=8, dp=8)),
]
IDS = [f"{m}-tp{p.tp}-pp{p.pp}-ep{p.ep}-dp{p.dp}" for m, *_, p in CASES]


def plan_for(model: str, kv_dtype: str, max_seq_len: int, avg: int | None, par: Parallel) -> PoolPlan:
    spec = load_model_spec(model, kv_dtype=kv_dtype, max_seq_len=max_seq_len, tp_size=par.tp // par.dp, pp_size=par.pp)
    limits = ServingLimits(max_seq_len=max_seq_len, max_batch_size=128, avg_seq_len=avg)
    return plan_pools(spec, limits, kv_memory_bytes=40 * 2**30)


def launches(engine: str) -> list[tuple[PoolPlan, Parallel, Emitted]]:
    out = []
    for model, kv, length, avg, par in CASES:
        plan = plan_for(model, kv, length, avg, par)
        out.append((plan, par, emit(engine, plan, "my/model", parallel=par)))
    return out


def parsed(venv: str, engine: str) -> dict[str, dict[str, Any]]:
    if engine_python(venv) is None:
        if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
            pytest.fail(f"the {venv} side venv is missing: run `make engines-venvs`")
        pytest.skip(f"no {venv} side venv (make engines-venvs)")
    items = [
        {"id": i, "engine": engine, "argv": list(e.argv or ())}
        for i, (_, _, e) in zip(IDS, launches(engine), strict=True)
    ]
    return run_engine(venv, items, HERE / "parsers_runner.py")


@pytest.fixture(scope="module", params=VLLM_RELEASES)
def vllm_parsed(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    return parsed(request.param, "vllm")


@pytest.fixture(scope="module")
def sglang_parsed() -> dict[str, dict[str, Any]]:
    return parsed("sglang", "sglang")


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_vllm_parses_the_launch_as_planned(index: int, vllm_parsed: dict[str, dict[str, Any]]) -> None:
    plan, par, _ = launches("vllm")[index]
    got = vllm_parsed[IDS[index]]
    assert "settings" in got, got
    s = got["settings"]
    assert s["model"] == "my/model" and s["kv_cache_memory_bytes"] == plan.budget_bytes
    assert (s["max_model_len"], s["max_num_seqs"]) == (plan.limits.max_seq_len, plan.limits.max_batch_size)
    assert s["block_size"] == plan.spec.tokens_per_block
    # vLLM: attention DP replicas of TP ranks; EP over all of them
    assert s["tensor_parallel_size"] * s["data_parallel_size"] == par.tp
    assert (s["pipeline_parallel_size"], s["data_parallel_size"]) == (par.pp, par.dp)
    assert s["enable_expert_parallel"] == (par.ep > 1)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_sglang_parses_the_launch_as_planned(index: int, sglang_parsed: dict[str, dict[str, Any]]) -> None:
    plan, par, _ = launches("sglang")[index]
    got = sglang_parsed[IDS[index]]
    assert "settings" in got, got
    s = got["settings"]
    assert s["model_path"] == "my/model" and s["context_length"] == plan.limits.max_seq_len
    assert s["max_running_requests"] == plan.limits.max_batch_size and s["page_size"] == plan.spec.tokens_per_block
    assert s["cuda_graph_bs_decode"] == list(plan.limits.graph_batch_sizes) and s["max_total_tokens"] > 0
    assert (s["tp_size"], s["pp_size"]) == (par.tp, par.pp)
    assert (s["dp_size"], s["enable_dp_attention"]) == (par.dp, par.dp > 1)
    assert s["ep_size"] == par.ep


def check_against(schema: dict[str, Any], config: dict[str, Any], where: str = "") -> None:
    """Every key of `config` is a field of the transcribed LLM API schema, of its type."""
    for key, value in config.items():
        assert key in schema, f"{where}{key} is not a TensorRT-LLM LLM API field"
        kind = schema[key]
        if isinstance(kind, dict):
            assert isinstance(value, dict), f"{where}{key} must be a mapping"
            check_against(kind, value, f"{where}{key}.")
        else:
            types = {"int": int, "bool": bool, "str": str, "list[int]": list, "dict[str,float]": dict}
            assert isinstance(value, types[kind]) and (kind != "int" or not isinstance(value, bool)), (key, value)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_trtllm_yaml_has_the_llm_api_fields(index: int) -> None:
    schema = json.loads(SCHEMA.read_text())
    plan, par, emitted = launches("trtllm")[index]
    config = emitted.config
    assert config is not None
    check_against(schema["fields"], config)
    assert config["tensor_parallel_size"] == par.tp
    assert config.get("pipeline_parallel_size", 1) == par.pp
    assert config.get("moe_expert_parallel_size", 1) == par.ep
    assert config.get("enable_attention_dp", False) == (par.dp > 1)
    assert config["kv_cache_config"]["max_gpu_total_bytes"] == plan.budget_bytes
