"""plan: split a memory budget between page pools (pure functions, no GPU)."""

from kvpool.plan.limits import ServingLimits, default_cuda_graph_batch_sizes
from kvpool.plan.result import ConstraintResult, GroupPlan, PoolPlan

__all__ = ["ConstraintResult", "GroupPlan", "PoolPlan", "ServingLimits", "default_cuda_graph_batch_sizes"]
