"""deploy: the deployment pipeline as library calls — resolve a model, size its
KV budget on the GPU, plan the pools, ask each engine what it would do, set up
and run a simulation. The CLI, `kvpool serve` and a notebook call the same three:

    from kvpool import deploy

    answer = deploy.fit("qwen3-32b", gpu="h100x2", max_seq_len=32768)
    answer.engines[0].verdict, answer.to_dict()      # == kvpool fit ... --json
    deploy.plan("gemma-4-26b-a4b", kv_memory="60GiB", kv_dtype="fp8").plan.pages("sliding")
    deploy.simulate("qwen3-8b", gpu="h100", trace="azure-conv", max_requests=500, rate=float("inf"))

One namespace rather than `kvpool.fit`/`kvpool.plan`: `kvpool.plan` is the sizing
package (pure functions, NumPy only), which a function of that name would shadow,
and `import kvpool` stays the NumPy-only core. `deploy.simulate_fleet` runs replicas behind a router (or prefill and decode
replicas), `deploy.fit_fleet` finds the smallest fleet for an SLO
(docs/fleet.md). `deploy.calibrate` fits the simulator's step times to
measurements of your own (`kvpool calibrate`). Each function takes typed keywords
(`PlanKeywords`: limits, budget, parallel layout, policy) and returns a frozen
result whose `to_dict()` is the matching command's `--json`. Bad input raises a
`KvpoolError` naming the option as the command line spells it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.lazy import lazy_names

if TYPE_CHECKING:
    from kvpool.deploy.budget import Budget, kv_budget
    from kvpool.deploy.calibrating import CalibrationResult, calibrate
    from kvpool.deploy.engine_fit import EngineFit
    from kvpool.deploy.fitting import FitResult, Search, fit
    from kvpool.deploy.fleet_fit import FleetFit, fit_fleet
    from kvpool.deploy.fleets import FleetLayout, FleetRun, FleetSimulation, simulate_fleet
    from kvpool.deploy.options import PlanKeywords, PlanRequest
    from kvpool.deploy.planning import PlanResult, plan
    from kvpool.deploy.resolution import Resolved, resolve
    from kvpool.deploy.simulation import SimulateKeywords, Simulation, SimulationResult, simulate

# Each name loads its own module on first use: `kvpool simulate` imports the
# simulation's modules alone, not the fit search, the fleets or the calibration.
__getattr__ = lazy_names(
    __name__,
    {
        "kvpool.deploy.budget": ("Budget", "kv_budget"),
        "kvpool.deploy.calibrating": ("CalibrationResult", "calibrate"),
        "kvpool.deploy.engine_fit": ("EngineFit",),
        "kvpool.deploy.fitting": ("FitResult", "Search", "fit"),
        "kvpool.deploy.fleet_fit": ("FleetFit", "fit_fleet"),
        "kvpool.deploy.fleets": ("FleetLayout", "FleetRun", "FleetSimulation", "simulate_fleet"),
        "kvpool.deploy.options": ("PlanKeywords", "PlanRequest"),
        "kvpool.deploy.planning": ("PlanResult", "plan"),
        "kvpool.deploy.resolution": ("Resolved", "resolve"),
        "kvpool.deploy.simulation": ("SimulateKeywords", "Simulation", "SimulationResult", "simulate"),
    },
)


__all__ = [
    "Budget",
    "CalibrationResult",
    "EngineFit",
    "FitResult",
    "FleetFit",
    "FleetLayout",
    "FleetRun",
    "FleetSimulation",
    "PlanKeywords",
    "PlanRequest",
    "PlanResult",
    "Resolved",
    "Search",
    "SimulateKeywords",
    "Simulation",
    "SimulationResult",
    "calibrate",
    "fit",
    "fit_fleet",
    "kv_budget",
    "plan",
    "resolve",
    "simulate",
    "simulate_fleet",
]
