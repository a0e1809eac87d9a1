"""`plan(sizing="occupancy" | "tuned", workload=TRACE)`: the plan of the
`occupancy` or `tuned` policy (`kvpool.sim.policies`), its assumptions added to
the plan's notes. `tuned` simulates step times, so it needs a GPU."""

from __future__ import annotations

import dataclasses
import math

from kvpool import presets
from kvpool.deploy.resolution import Resolved
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.presets.traces import load_trace
from kvpool.sim import StepTimeModel, load_weights
from kvpool.sim.policies import plan_for
from kvpool.trace import Trace


def arrival_rate(rate: float | str) -> float | None:
    """A workload rate: requests/s > 0, `inf` (offline) or `trace` (None: the
    trace's own times). KvpoolError otherwise."""
    text = str(rate).strip().lower()
    if text == "trace":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # nan and -inf fail too
        raise KvpoolError(f"cannot read --workload-rate {rate!r}; give requests/s, inf or trace")
    return value


def tuned_inputs(
    resolved: Resolved, trace: Trace, sim_gpu: str | None, rate: float | str
) -> tuple[StepTimeModel, Trace, str]:
    """(the step-time model, the trace at its rate, the note saying both) of `tuned`."""
    req = resolved.request
    gpu = sim_gpu or req.budget.gpu
    if gpu is None:
        raise KvpoolError("--sizing tuned simulates step times: give --sim-gpu NAME (or --gpu)")
    model = StepTimeModel.build(resolved.spec, presets.load_gpu(gpu), load_weights(req.model.model))
    text = str(rate).lower()
    note = f"tuned: step times of {gpu}, arrivals at {text}" + (" (offline)" if text == "inf" else "")
    return model, trace.with_rate(arrival_rate(rate)), note


def adaptive_plan(resolved: Resolved, sizing: str, sim_gpu: str | None, workload_rate: float | str) -> PoolPlan:
    """The plan `sizing` asks for, on the request's --workload trace. Raises
    KvpoolError on a missing trace or GPU."""
    req = resolved.request
    assert req.workload is not None  # planning.sized_plan checks it
    trace = load_trace(req.workload)
    model = None
    notes: tuple[str, ...] = ()
    if sizing == "tuned":
        model, trace, note = tuned_inputs(resolved, trace, sim_gpu, workload_rate)
        notes = (note,)
    elif sim_gpu is not None:
        raise KvpoolError("--sim-gpu is for --sizing tuned")
    kv = resolved.budget.kv_bytes
    pp = plan_for(
        resolved.spec, resolved.limits, sizing, kv_memory_bytes=kv, trace=trace, fit=req.shrink_to_fit, model=model
    )
    return dataclasses.replace(pp.plan, notes=pp.plan.notes + pp.notes + notes)
