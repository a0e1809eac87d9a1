"""kvpool: plan and manage the paged KV cache of LLM serving engines.

Layers (imports point downwards only): cli -> deploy -> engine | sim -> engines
-> sched -> cache -> plan -> spec -> models -> presets (docs/design.md). `spec`,
`plan` and `cache` need only NumPy; `import kvpool` loads only those.
`kvpool.deploy` (loaded on first use) is the deployment pipeline a notebook
calls: `deploy.fit`, `deploy.plan`, `deploy.simulate`.
"""

import importlib
from typing import Any

from kvpool.cache import KVCacheManager
from kvpool.errors import InfeasiblePlanError, KvpoolError, OutOfPagesError, SpecError
from kvpool.plan import PoolPlan, ServingLimits, Workload, plan_pools
from kvpool.spec import LayerGroup, ModelSpec, load_model_spec

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`kvpool.deploy`, imported on first use (it loads the engines' models and the simulator)."""
    if name == "deploy":
        return importlib.import_module("kvpool.deploy")
    raise AttributeError(f"module 'kvpool' has no attribute {name!r}")


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
