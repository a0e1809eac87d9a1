"""kvpool: plan and manage the paged KV cache of LLM serving engines.

Layers (imports point downwards only): cli -> engine | sim -> cache -> plan ->
spec -> presets. `spec`, `plan` and `cache` need only NumPy.
"""

from kvpool.cache import KVCacheManager
from kvpool.errors import InfeasiblePlanError, KvpoolError, OutOfPagesError, SpecError
from kvpool.plan import PoolPlan, ServingLimits, Workload, plan_pools
from kvpool.spec import LayerGroup, ModelSpec, load_model_spec

__version__ = "0.1.0"

__all__ = [
    "InfeasiblePlanError",
    "KVCacheManager",
    "KvpoolError",
    "LayerGroup",
    "ModelSpec",
    "OutOfPagesError",
    "PoolPlan",
    "ServingLimits",
    "SpecError",
    "Workload",
    "load_model_spec",
    "plan_pools",
]
