"""The plan options shared by `kvpool plan`, `fit`, `warmup` and `simulate`:
model, budget, serving limits and sizing policy, read into the keywords the
library's pipeline takes (`kvpool.deploy`: `PlanKeywords`)."""

from __future__ import annotations

import argparse
from typing import Any

from kvpool.cli.common import (
    add_model_args,
    checked,
    fraction,
    int_at_least,
    int_items,
    positive_int,
    size_arg,
    size_or_zero_arg,
)
from kvpool.deploy.budget import DEFAULT_MEMORY_FRACTION
from kvpool.deploy.gpus import gpu_and_count
from kvpool.deploy.options import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_NUM_TOKENS, DEFAULT_MAX_SEQ_LEN, PARTS
from kvpool.errors import KvpoolError, LimitsError
from kvpool.plan.sizing import parse_shares
from kvpool.spec.loader import SSM_DTYPES

non_negative_int = int_at_least(0)


def optional_tokens(text: str) -> int | None:
    """A positive token count, or `none` for no per-iteration budget (0 is
    refused: it reads as "no tokens per step", which cannot serve anything)."""
    if text.lower() == "none":
        return None
    if text.strip() == "0":
        raise argparse.ArgumentTypeError("expected a positive token budget, or 'none' for no per-step budget; got '0'")
    return positive_int(text)


def add_plan_args(p: argparse.ArgumentParser, *, model: bool = True, workload: bool = True) -> None:
    """Add MODEL (unless `model=False`), budget, limit and policy options to `p`
    (`--workload` unless `workload=False`, for commands that take a trace otherwise)."""
    if model:
        add_model_args(p)
    b = p.add_argument_group("budget per rank (--kv-memory, or --gpu: the whole GPU, or --gpu with --non-kv-memory)")
    b.add_argument("--kv-memory", type=size_arg, metavar="SIZE", help="KV cache budget, e.g. 40GiB, 512MiB or bytes")
    b.add_argument(
        "--gpu",
        type=checked(gpu_and_count),
        metavar="NAME[xN]",
        help="GPU preset (kvpool gpus), with a count for N GPUs as tensor parallelism (h100x2), or auto: "
        "this machine's GPUs (NVML); budget = GPU memory x utilization - weights per rank - "
        "activations - CUDA graphs - reserve (docs/plan.md)",
    )
    b.add_argument(
        "--non-kv-memory",
        type=size_arg,
        metavar="SIZE",
        help="with --gpu: all non-KV memory (weights, activations, graphs); budget = (GPU - this) x F",
    )
    b.add_argument(
        "--memory-fraction",
        "--gpu-memory-utilization",
        dest="memory_fraction",
        type=fraction,
        default=None,
        metavar="F",
        help=f"with --gpu: share of the GPU's memory the engine uses (default {DEFAULT_MEMORY_FRACTION}, "
        "vLLM's gpu_memory_utilization); with --non-kv-memory: share of the rest",
    )
    for flag, what in (
        ("--weights-memory", "weights per rank (default: safetensors headers, else the parameter count)"),
        ("--activation-memory", "activation peak per rank (default: estimate for --max-num-tokens)"),
        ("--cuda-graph-memory", "CUDA-graph pool per rank (default: estimate for the largest graph; 0 if eager)"),
        ("--reserved-memory", "an allowance vLLM's formula has none of (default 0)"),
    ):
        b.add_argument(flag, type=size_or_zero_arg, metavar="SIZE", default=None, help=f"with --gpu: {what}")
    lim = p.add_argument_group("serving limits")
    lim.add_argument(
        "--max-batch-size",
        type=positive_int,  # its upper bound is ServingLimits' (plan/limits.py), named by `resolve`
        default=DEFAULT_MAX_BATCH_SIZE,
        metavar="B",
        help=f"most requests per step (default {DEFAULT_MAX_BATCH_SIZE})",
    )
    lim.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        metavar="L",
        help=f"longest request, prompt plus output (default: the model's max positions, at most {DEFAULT_MAX_SEQ_LEN})",
    )
    lim.add_argument(
        "--max-num-tokens",
        type=optional_tokens,
        default=DEFAULT_MAX_NUM_TOKENS,
        metavar="N",
        help=f"per-iteration token budget (default {DEFAULT_MAX_NUM_TOKENS}; 'none' for no chunked-prefill budget)",
    )
    lim.add_argument(
        "--draft-len",
        type=non_negative_int,
        default=0,
        metavar="D",
        help="speculative draft tokens per step (default 0)",
    )
    lim.add_argument(
        "--mamba-ssm-dtype",
        choices=tuple(SSM_DTYPES),
        default="auto",
        help="dtype of Mamba layers' SSM state (vLLM's --mamba-ssm-cache-dtype; auto: the model's, Nemotron-H's "
        "config field; float32 as Jamba's and Falcon-H1's model cards recommend doubles the state)",
    )
    lim.add_argument(
        "--draft-model",
        default=None,
        metavar="MODEL|mtp",
        help="the drafter whose KV the plan holds beside the model's, in its own pools: a draft model or "
        "EAGLE head (preset, path or Hugging Face id), or mtp for the model's own MTP layers (spec/drafts.py)",
    )
    lim.add_argument(
        "--extra-kv-tokens",
        type=non_negative_int,
        default=0,
        metavar="E",
        help="extra KV tokens per request, e.g. for MTP/Eagle (default 0)",
    )
    lim.add_argument(
        "--avg-seq-len",
        type=positive_int,
        default=None,
        metavar="S",
        help="typical request length; enables the typical step and its constraints "
        "(must be <= --max-seq-len; default: unknown, ratio from the reference "
        "request of 2049 positions)",
    )
    lim.add_argument(
        "--cuda-graph-batch-sizes",
        type=checked(batch_sizes),
        default=None,
        metavar="B1,B2,...",
        help="CUDA-graph batch sizes (default 1, 2, 4, then multiples of 8 up to min(B, 256))",
    )
    pol = p.add_argument_group("sizing policy")
    pol.add_argument(
        "--pool-ratio",
        type=checked(parse_shares),
        default=None,
        metavar="NAME=SHARE,...",
        help="explicit byte share per group (summing to 1); drops all constraints",
    )
    if workload:
        pol.add_argument(
            "--workload",
            default=None,
            metavar="TRACE",
            help="set the ratio from the expected pages of a trace's (prompt, output) "
            "lengths: a bundled trace (azure-conv, azure-code, mooncake-conv) "
            "or a trace file (CSV or JSON lines: docs/traces.md)",
        )
    pol.add_argument(
        "--fit",
        action="store_true",
        help="shrink the longest request of a constraint that does not fit, instead of failing",
    )
    pol.add_argument(
        "--phase",
        choices=("final", "profile"),
        default="final",
        help="final (default) or profile: the temporary plan sized for warmup shapes",
    )


def batch_sizes(text: str) -> tuple[int, ...]:
    """`1,2,4,8` -> (1, 2, 4, 8): positive counts, no empty item."""
    try:
        return int_items(text)
    except KvpoolError as e:
        raise LimitsError(f"cannot read CUDA-graph batch sizes: {e}") from None


# The keywords read as the options' values, by the option's dest.
PLAN_KEYWORDS = (
    "kv_dtype",
    "tp",
    "pp",
    "ep",
    "dp",
    "tokens_per_block",
    "draft_model",
    "mamba_ssm_dtype",
    "kv_memory",
    "non_kv_memory",
    "memory_fraction",
    *PARTS,
    "max_batch_size",
    "max_seq_len",
    "max_num_tokens",
    "draft_len",
    "extra_kv_tokens",
    "avg_seq_len",
    "pool_ratio",
    "phase",
)


def plan_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The `PlanKeywords` the options of `add_plan_args` give (the library reads
    the texts again with the same readers the options were checked with)."""
    out = {k: getattr(args, k) for k in PLAN_KEYWORDS}
    sizes = args.cuda_graph_batch_sizes
    out["cuda_graph_batch_sizes"] = None if sizes is None else batch_sizes(sizes)
    out["workload"] = getattr(args, "workload", None)
    out["shrink_to_fit"] = args.fit
    return out
