"""A `PlanRequest` resolved once: the model's config read once, its spec at the
plan's max_seq_len, the serving limits and the KV budget per rank (`budget.py`,
the one budget function); then the plan it describes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.deploy.budget import Budget, kv_budget
from kvpool.deploy.options import DEFAULT_MAX_SEQ_LEN, LimitOptions, ModelOptions, PlanRequest
from kvpool.errors import KvpoolError, LimitsError, flagged
from kvpool.models import ModelSource
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.sizing import check_pool_ratio
from kvpool.plan.workload import Workload
from kvpool.presets.traces import load_trace
from kvpool.spec import ModelSpec
from kvpool.spec import loader as spec_loader
from kvpool.spec.drafts import load_draft
from kvpool.spec.loader import read_model_config, spec_from_read

ConfigRead = tuple[str, str, dict[str, Any], ModelSource | None]  # what read_model_config returns

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
                check_pool_ratio(self.spec, req.pool_ratio)
            except KvpoolError as e:
                raise LimitsError(f"--pool-ratio: {e}") from None
        return plan_pools(
            self.spec,
            self.limits,
            kv_memory_bytes=(budget or self.budget).kv_bytes,
            pool_ratio=None if req.pool_ratio is None else dict(req.pool_ratio),
            policy=workload_policy(req.workload),
            fit=req.shrink_to_fit,
            phase=req.phase,
        )


def check_positions(config: Mapping[str, Any], max_seq_len: int, flag: str = "--max-seq-len") -> None:
    """Refuse a longest request past the config's positions, as vLLM refuses a
    max_model_len past them unless told to (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1):
    RoPE beyond them is untrained, and 2**40 positions ask for petabytes of pages."""
    text = config.get("text_config")
    max_pos = (text if isinstance(text, Mapping) and "max_position_embeddings" in text else config).get(
        "max_position_embeddings"
    )
    if isinstance(max_pos, int) and not isinstance(max_pos, bool) and 0 < max_pos < max_seq_len:
        raise LimitsError(
            f"{flag} {max_seq_len:,} is past the model's {max_pos:,} positions (max_position_embeddings); "
            f"give {flag} {max_pos} or less"
        )


def check_tp_divides_heads(config: Mapping[str, Any], tp: int) -> None:
    """The library's check (`spec.loader.check_tp_divides_heads`) on the whole
    --tp, as vLLM checks it (the spec itself is built at --tp / --dp under DP
    attention), its error naming the flag."""
    with flagged("--tp"):
        spec_loader.check_tp_divides_heads(config, tp)


def model_spec(model: ModelOptions, read: ConfigRead | None = None, max_seq_len: int | None = None) -> ModelSpec:
    """The spec of one rank of `model` from its config (`read`, else read now; a tp
    that does not divide the heads refused by name), at `max_seq_len` when given: a
    window of at least L is then full attention."""
    if read is None:
        read = read_model_config(model.model)
    check_tp_divides_heads(read[2], model.tp)
    spec = spec_from_read(
        read,
        kv_dtype=model.kv_dtype,
        tp_size=model.attention_tp,
        pp_size=model.pp,
        tokens_per_block=model.tokens_per_block,
        max_seq_len=max_seq_len,
        ssm_dtype=model.mamba_ssm_dtype,
    )
    return spec if model.draft_model is None else with_draft(spec, model.draft_model, max_seq_len)


def with_draft(spec: ModelSpec, draft: str, max_seq_len: int | None) -> ModelSpec:
    """`spec` with the drafter's layers as its draft groups (a draft model, an
    EAGLE head, or `mtp`: spec/drafts.py)."""
    with flagged("--draft-model"):
        try:
            return load_draft(spec, draft, max_seq_len=max_seq_len)
        except OSError as e:  # a name the file system refuses (too long, ...)
            raise KvpoolError(f"cannot read {draft[:60]!r}: {e.strerror}") from None


def load_spec(model: ModelOptions, max_seq_len: int | None) -> tuple[ModelSpec, int]:
    """The model spec at the plan's max_seq_len and that L: `max_seq_len`, else
    the model's max positions capped at 8192. The config is read once."""
    read = read_model_config(model.model)
    max_pos = read[2].get("max_position_embeddings")
    max_len = max_seq_len
    if max_len is None:
        max_len = min(int(max_pos) if max_pos else DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    else:
        check_positions(read[2], max_len)
    return model_spec(model, read, max_len), max_len


def serving_limits(options: LimitOptions, max_seq_len: int) -> ServingLimits:
    """ServingLimits from the limit options at the `max_seq_len` `load_spec`
    resolved; a field the library refuses is named by the option that set it."""
    try:
        return ServingLimits(
            max_batch_size=options.max_batch_size,
            max_seq_len=max_seq_len,
            max_num_tokens=options.max_num_tokens,
            max_draft_len=options.draft_len,
            num_extra_kv_tokens=options.extra_kv_tokens,
            avg_seq_len=options.avg_seq_len,
            cuda_graph_batch_sizes=options.cuda_graph_batch_sizes,
        )
    except LimitsError as e:
        field = str(e).split(" ", 1)[0]
        if field not in LIMIT_FLAGS or LIMIT_FLAGS[field] in str(e):
            raise
        raise LimitsError(f"{LIMIT_FLAGS[field]}: {e}") from None


def resolve(request: PlanRequest, *, weights_bytes: int | None = None, gpu_only_for_budget: bool = True) -> Resolved:
    """model -> spec -> limits -> budget, once (`kv_budget` for the keywords)."""
    spec, max_len = load_spec(request.model, request.limits.max_seq_len)
    limits = serving_limits(request.limits, max_len)
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
