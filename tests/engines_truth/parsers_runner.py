"""Referee: the engines' own command-line parsers, run in their side venvs.

Reads a JSON list of {"id", "engine", "argv"} on stdin (argv as kvpool emits it,
`vllm serve MODEL ...` or `python -m sglang.launch_server ...`) and writes, per
item, the settings the engine's own parser makes of it: vLLM's
`make_arg_parser` then `EngineArgs.from_cli_args` (the fields `vllm serve`
builds its engine from), SGLang's `ServerArgs.add_cli_args` then
`ServerArgs.from_cli_args`. A refusal (argparse exits) is reported with its
message. This file imports the engine and is never imported by kvpool.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import sys
import warnings
from typing import Any

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

VLLM_FIELDS = (
    "model",
    "kv_cache_memory_bytes",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "kv_cache_dtype",
)
SGLANG_FIELDS = (
    "model_path",
    "context_length",
    "max_total_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "page_size",
    "tp_size",
    "pp_size",
    "dp_size",
    "enable_dp_attention",
    "ep_size",
    "kv_cache_dtype",
    "swa_full_tokens_ratio",
    "mem_fraction_static",
)


def vllm_settings(argv: list[str]) -> dict[str, Any]:
    utils = importlib.import_module("vllm.utils.argparse_utils")
    # `vllm serve`'s parser: entrypoints/launchers/cli_args.py in 0.32, entrypoints/common/cli_args.py in 0.33
    for where in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"):
        with contextlib.suppress(ImportError):
            cli_args = importlib.import_module(where)
            break
    parser = cli_args.make_arg_parser(utils.FlexibleArgumentParser())
    assert argv[:2] == ["vllm", "serve"], argv[:2]
    args = parser.parse_args(argv[2:])
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    engine_args = importlib.import_module("vllm.engine.arg_utils").EngineArgs.from_cli_args(args)
    return {k: getattr(engine_args, k) for k in VLLM_FIELDS}


def sglang_settings(argv: list[str]) -> dict[str, Any]:
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv[:3]
    args = parser.parse_args(argv[3:])
    return {k: getattr(args, k, None) for k in SGLANG_FIELDS} | {"cuda_graph_bs_decode": args.cuda_graph_bs_decode}


def main() -> None:
    out = []
    for item in json.load(sys.stdin):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                read = vllm_settings if item["engine"] == "vllm" else sglang_settings
                out.append({"id": item["id"], "settings": read(item["argv"])})
        except SystemExit:
            out.append({"id": item["id"], "refused": err.getvalue().strip().splitlines()[-1:]})
        except Exception as e:  # reported, not hidden
            out.append({"id": item["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
