"""The plan options shared by `kvpool plan`, `kvpool warmup` and `kvpool simulate`:
model, budget, serving limits and sizing policy -> `PoolPlan`.

The budget options are read by `cli/budget.py`, the one budget function.
"""

from __future__ import annotations

import argparse

import numpy as np

from kvpool.cli.budget import DEFAULT_MEMORY_FRACTION, Budget, kv_budget
from kvpool.cli.common import add_model_args, attention_tp, int_at_least, positive_int
from kvpool.errors import LimitsError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.sizing import parse_shares
from kvpool.plan.workload import Workload
from kvpool.presets.traces import load_trace
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.spec.loader import read_config

DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_SEQ_LEN = 8192
DEFAULT_MAX_NUM_TOKENS = 8192


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
    b.add_argument("--kv-memory", metavar="SIZE", help="KV cache budget, e.g. 40GiB, 512MiB or bytes")
    b.add_argument(
        "--gpu",
        metavar="NAME",
        help="GPU preset (kvpool gpus); budget = GPU memory x utilization - weights per rank - "
        "activations - CUDA graphs - reserve (docs/plan.md)",
    )
    b.add_argument(
        "--non-kv-memory",
        metavar="SIZE",
        help="with --gpu: all non-KV memory (weights, activations, graphs); budget = (GPU - this) x F",
    )
    b.add_argument(
        "--memory-fraction",
        "--gpu-memory-utilization",
        dest="memory_fraction",
        type=float,
        default=None,
        metavar="F",
        help=f"with --gpu: share of the GPU's memory the engine uses (default {DEFAULT_MEMORY_FRACTION}, "
        "vLLM's gpu_memory_utilization); with --non-kv-memory: share of the rest",
    )
    for flag, what in (
        ("--weights-memory", "weights per rank (default: safetensors headers, else the parameter count)"),
        ("--activation-memory", "activation peak per rank (default: estimate for --max-num-tokens)"),
        ("--cuda-graph-memory", "CUDA-graph pool per rank (default: estimate for the largest graph; 0 if eager)"),
        ("--reserved-memory", "CUDA context, workspaces, fragmentation (default 1GiB)"),
    ):
        b.add_argument(flag, metavar="SIZE", default=None, help=f"with --gpu: {what}")
    lim = p.add_argument_group("serving limits")
    lim.add_argument(
        "--max-batch-size",
        type=positive_int,
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
        default=None,
        metavar="B1,B2,...",
        help="CUDA-graph batch sizes (default 1, 2, 4, then multiples of 8 up to min(B, 256))",
    )
    pol = p.add_argument_group("sizing policy")
    pol.add_argument(
        "--pool-ratio",
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
            "or a trace file",
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


def parse_pool_ratio(text: str | None) -> dict[str, float] | None:
    """`--pool-ratio full=0.3,sliding=0.7` -> {"full": 0.3, "sliding": 0.7}."""
    return None if text is None else parse_shares(text)


def parse_batch_sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LimitsError(f"cannot read CUDA-graph batch sizes {text!r}; write e.g. 1,2,4,8") from None


def spec_for_plan(args: argparse.Namespace) -> tuple[ModelSpec, int]:
    """The model spec at the plan's max_seq_len (a window of at least L is full
    attention) and that L: --max-seq-len, else the model's max positions capped
    at 8192. The config is read once; `args` is never written."""
    _, config = read_config(args.model)
    max_len = args.max_seq_len
    if max_len is None:
        max_pos = config.get("max_position_embeddings")
        max_len = min(int(max_pos) if max_pos else DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    spec = load_model_spec(
        args.model,
        kv_dtype=args.kv_dtype,
        tp_size=attention_tp(args),
        pp_size=args.pp,
        tokens_per_block=args.tokens_per_block,
        max_seq_len=max_len,
    )
    return spec, max_len


def limits_from_args(args: argparse.Namespace, max_seq_len: int) -> ServingLimits:
    """ServingLimits from the parsed options, at the `max_seq_len` that
    `spec_for_plan` resolved."""
    return ServingLimits(
        max_batch_size=args.max_batch_size,
        max_seq_len=max_seq_len,
        max_num_tokens=args.max_num_tokens,
        max_draft_len=args.draft_len,
        num_extra_kv_tokens=args.extra_kv_tokens,
        avg_seq_len=args.avg_seq_len,
        cuda_graph_batch_sizes=parse_batch_sizes(args.cuda_graph_batch_sizes),
    )


def workload_from_args(args: argparse.Namespace) -> Workload | None:
    """The `--workload` policy, when the command has that option and it is given."""
    source = getattr(args, "workload", None)
    if source is None:
        return None
    trace = load_trace(source)
    return Workload(np.stack([trace.prompt_len, trace.output_len], axis=1))


def budget_from_args(args: argparse.Namespace) -> Budget:
    """The KV budget per rank the options describe (cli/budget.py)."""
    _, max_len = spec_for_plan(args)
    return kv_budget(args, limits_from_args(args, max_len))


def plan_from_args(args: argparse.Namespace, budget: Budget | None = None) -> PoolPlan:
    """The plan the options describe, on `budget` (default: the options' own).
    Raises KvpoolError subclasses on bad input or an infeasible plan."""
    spec, max_len = spec_for_plan(args)
    limits = limits_from_args(args, max_len)
    budget = kv_budget(args, limits) if budget is None else budget
    return plan_pools(
        spec,
        limits,
        kv_memory_bytes=budget.kv_bytes,
        pool_ratio=parse_pool_ratio(args.pool_ratio),
        policy=workload_from_args(args),
        fit=args.fit,
        phase=args.phase,
    )
