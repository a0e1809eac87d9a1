"""kvpool: plan and manage the paged KV cache of LLM serving engines.

Layers (imports point downwards only): cli -> deploy -> engine | sim -> engines
-> sched -> cache -> plan -> spec -> models -> presets (docs/design.md). `spec`,
`plan` and `cache` need only NumPy; `import kvpool` loads none of them until
a name is first used.
`kvpool.deploy` (loaded on first use) is the deployment pipeline a notebook
calls: `deploy.fit`, `deploy.plan`, `deploy.simulate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.lazy import lazy_names

if TYPE_CHECKING:
    from kvpool.cache import KVCacheManager
    from kvpool.errors import InfeasiblePlanError, KvpoolError, OutOfPagesError, SpecError
    from kvpool.plan import PoolPlan, ServingLimits, Workload, plan_pools
    from kvpool.spec import LayerGroup, ModelSpec, load_model_spec

__version__ = "0.1.0"

# Each name loads its module on first use, and `kvpool.deploy` (the engines'
# models and the simulator) too: the `kvpool` command's start imports only what
# its subcommand needs, and sets up NumPy before anything loads it (cli/main.py).
__getattr__ = lazy_names(
    __name__,
    {
        "kvpool.cache": ("KVCacheManager",),
        "kvpool.errors": ("InfeasiblePlanError", "KvpoolError", "OutOfPagesError", "SpecError"),
        "kvpool.plan": ("PoolPlan", "ServingLimits", "Workload", "plan_pools"),
        "kvpool.spec": ("LayerGroup", "ModelSpec", "load_model_spec"),
    },
    ("cache", "deploy", "errors", "plan", "spec"),
)


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
