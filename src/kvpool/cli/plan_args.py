"""The plan options shared by `kvpool plan`, `kvpool warmup` and `kvpool simulate`:
model, budget, serving limits and sizing policy -> `PoolPlan`.

A command reads its options once into a `PlanRequest` (cli/request.py);
`resolve` turns it into the model spec, limits and budget (`cli/budget.py`, the
one budget function), reading the model's config once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from kvpool.cli.budget import DEFAULT_MEMORY_FRACTION, Budget, kv_budget
from kvpool.cli.common import (
    add_model_args,
    check_positions,
    check_tp_divides_heads,
    checked,
    flagged,
    fraction,
    gpu_name,
    int_at_least,
    int_items,
    positive_int,
    say_fallback,
    size_arg,
    size_or_zero_arg,
)
from kvpool.cli.request import LimitOptions, ModelOptions, PlanRequest
from kvpool.errors import KvpoolError, LimitsError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.sizing import check_pool_ratio, parse_shares
from kvpool.plan.workload import Workload
from kvpool.presets.traces import load_trace
from kvpool.spec import ModelSpec
from kvpool.spec.drafts import load_draft
from kvpool.spec.loader import SSM_DTYPES, read_model_config, spec_from_read

DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_SEQ_LEN = 8192
DEFAULT_MAX_NUM_TOKENS = 8192
# ServingLimits' fields (its errors start with the field's name) -> the option that sets each.
LIMIT_FLAGS = {
    "max_batch_size": "--max-batch-size",
    "max_seq_len": "--max-seq-len",
    "max_num_tokens": "--max-num-tokens",
    "max_draft_len": "--draft-len",
    "num_extra_kv_tokens": "--extra-kv-tokens",
    "avg_seq_len": "--avg-seq-len",
    "cuda_graph_batch_sizes": "--cuda-graph-batch-sizes",
}


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
        type=checked(gpu_name),
        metavar="NAME",
        help="GPU preset (kvpool gpus); budget = GPU memory x utilization - weights per rank - "
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
        ("--reserved-memory", "CUDA context, workspaces, fragmentation (default 1GiB)"),
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


def batch_sizes(text: str) -> tuple[int, ...]:
    """`1,2,4,8` -> (1, 2, 4, 8): positive counts, no empty item."""
    try:
        return int_items(text)
    except KvpoolError as e:
        raise LimitsError(f"cannot read CUDA-graph batch sizes: {e}") from None


def parse_batch_sizes(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else batch_sizes(text)


@dataclass(frozen=True)
class Resolved:
    """A `PlanRequest` resolved once: the model's spec at the plan's max_seq_len,
    the serving limits and the KV budget per rank."""

    request: PlanRequest
    spec: ModelSpec
    limits: ServingLimits
    budget: Budget

    def plan(self, budget: Budget | None = None) -> PoolPlan:
        """The plan the request describes, on `budget` (default: its own). Raises
        KvpoolError subclasses on bad input or an infeasible plan."""
        req = self.request
        if req.pool_ratio is not None:
            try:
                check_pool_ratio(self.spec, parse_shares(req.pool_ratio))
            except KvpoolError as e:
                raise LimitsError(f"--pool-ratio: {e}") from None
        return plan_pools(
            self.spec,
            self.limits,
            kv_memory_bytes=(budget or self.budget).kv_bytes,
            pool_ratio=parse_pool_ratio(req.pool_ratio),
            policy=workload_policy(req.workload),
            fit=req.fit,
            phase=req.phase,
        )


def load_spec(model: ModelOptions, max_seq_len: int | None) -> tuple[ModelSpec, int]:
    """The model spec at the plan's max_seq_len (a window of at least L is full
    attention) and that L: `max_seq_len`, else the model's max positions capped
    at 8192. The config is read once."""
    read = read_model_config(model.model)
    check_tp_divides_heads(read[2], model.tp)
    max_pos = read[2].get("max_position_embeddings")
    max_len = max_seq_len
    if max_len is None:
        max_len = min(int(max_pos) if max_pos else DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    else:
        check_positions(read[2], max_len)
    spec = spec_from_read(
        read,
        kv_dtype=model.kv_dtype,
        tp_size=model.attention_tp,
        pp_size=model.pp,
        tokens_per_block=model.tokens_per_block,
        max_seq_len=max_len,
        ssm_dtype=model.ssm_dtype,
    )
    if model.draft_model is not None:
        with flagged("--draft-model"):
            try:
                spec = load_draft(spec, model.draft_model, max_seq_len=max_len)
            except OSError as e:  # a name the file system refuses (too long, ...)
                raise KvpoolError(f"cannot read {model.draft_model[:60]!r}: {e.strerror}") from None
    say_fallback(spec)
    return spec, max_len


def serving_limits(options: LimitOptions, max_seq_len: int) -> ServingLimits:
    """ServingLimits from the limit options, at the `max_seq_len` `load_spec` resolved."""
    return ServingLimits(
        max_batch_size=options.max_batch_size,
        max_seq_len=max_seq_len,
        max_num_tokens=options.max_num_tokens,
        max_draft_len=options.draft_len,
        num_extra_kv_tokens=options.extra_kv_tokens,
        avg_seq_len=options.avg_seq_len,
        cuda_graph_batch_sizes=parse_batch_sizes(options.cuda_graph_batch_sizes),
    )


def resolve(request: PlanRequest, *, weights_bytes: int | None = None, gpu_only_for_budget: bool = True) -> Resolved:
    """model -> spec -> limits -> budget, once (`kv_budget` for the keywords)."""
    spec, max_len = load_spec(request.model, request.limits.max_seq_len)
    try:
        limits = serving_limits(request.limits, max_len)
    except LimitsError as e:  # the library's bound, told as the option that set the field
        field = str(e).split(" ", 1)[0]
        if field not in LIMIT_FLAGS or LIMIT_FLAGS[field] in str(e):
            raise
        raise LimitsError(f"{LIMIT_FLAGS[field]}: {e}") from None
    budget = kv_budget(
        request.budget,
        request.model,
        spec,
        limits,
        weights_bytes=weights_bytes,
        gpu_only_for_budget=gpu_only_for_budget,
    )
    return Resolved(request, spec, limits, budget)


def workload_policy(source: str | None) -> Workload | None:
    """The `--workload` policy, when the command has that option and it is given."""
    if source is None:
        return None
    with flagged("--workload"):
        trace = load_trace(source)
    return Workload(np.stack([trace.prompt_len, trace.output_len], axis=1))


def plan_from_args(args: argparse.Namespace) -> PoolPlan:
    """The plan the options describe (for commands that need nothing else)."""
    return resolve(PlanRequest.from_args(args)).plan()
