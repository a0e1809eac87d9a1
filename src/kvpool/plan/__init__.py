"""plan: split a memory budget between page pools (pure functions, no GPU)."""

from kvpool.plan.batches import (
    REFERENCE_REQUEST,
    Constraint,
    context_constraint,
    decode_shape,
    guarantees,
    minimal_decode,
    typical_step,
)
from kvpool.plan.families import longest_decode_batch, rules_for
from kvpool.plan.limits import ServingLimits, default_cuda_graph_batch_sizes
from kvpool.plan.result import Advice, ConstraintResult, GroupPlan, PoolPlan, SharedPool
from kvpool.plan.sizing import (
    estimate_profile_bytes,
    plan_constraints,
    plan_guarantees,
    plan_pools,
    ratio_from_batch,
)
from kvpool.plan.waterfill import waterfill
from kvpool.plan.workload import RatioPolicy, Workload

__all__ = [
    "REFERENCE_REQUEST",
    "Advice",
    "Constraint",
    "ConstraintResult",
    "GroupPlan",
    "PoolPlan",
    "RatioPolicy",
    "SharedPool",
    "ServingLimits",
    "Workload",
    "context_constraint",
    "decode_shape",
    "default_cuda_graph_batch_sizes",
    "guarantees",
    "estimate_profile_bytes",
    "longest_decode_batch",
    "minimal_decode",
    "plan_constraints",
    "plan_guarantees",
    "plan_pools",
    "ratio_from_batch",
    "rules_for",
    "typical_step",
    "waterfill",
]
