"""Factories for the rebalance tests: a small sliding + full plan, and the
shifting trace case of docs/sim.md made small enough for a unit test."""

from __future__ import annotations

import math

from kvpool.plan import PoolPlan, ServingLimits
from kvpool.presets import load_gpu
from kvpool.presets.traces import load_trace
from kvpool.sim import StepTimeModel, load_weights
from kvpool.sim.policies import plan_for
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.trace import Trace

GiB = 2**30


def gemma(max_seq_len: int) -> ModelSpec:
    return load_model_spec("gemma-3-27b", max_seq_len=max_seq_len)


def small_plan(kv_gib: float = 1.0, max_seq_len: int = 4096, batch: int = 16) -> PoolPlan:
    """gemma-3-27b (window 1,024, 32-token pages) at the reference split."""
    limits = ServingLimits(max_batch_size=batch, max_seq_len=max_seq_len, max_num_tokens=2048)
    return plan_for(gemma(max_seq_len), limits, "reference", kv_memory_bytes=int(kv_gib * GiB)).plan


SHIFT_TRACE = "azure-conv:100+mooncake-conv:30"  # chat, then long-context chat


def shifting_case() -> tuple[ServingLimits, Trace, StepTimeModel, ModelSpec, int]:
    """gemma-3-27b on an H100, 6 GiB of KV, B = 256, L = 16k, N = 8192, the
    shifting trace at `--rate inf`."""
    spec = gemma(16384)
    limits = ServingLimits(max_batch_size=256, max_seq_len=16384, max_num_tokens=8192)
    trace = load_trace(SHIFT_TRACE).with_rate(math.inf)
    model = StepTimeModel.build(spec, load_gpu("h100"), load_weights("gemma-3-27b"))
    return limits, trace, model, spec, 6 * GiB
