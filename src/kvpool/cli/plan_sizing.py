"""`kvpool plan --workload TRACE --sizing occupancy|tuned`: the plan of the
`occupancy` or `tuned` policy (`kvpool.sim.policies`), its assumptions added
to the plan's notes."""

from __future__ import annotations

import dataclasses

from kvpool import presets
from kvpool.cli.plan_args import Resolved
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.presets.traces import load_trace
from kvpool.sim import StepTimeModel, load_weights
from kvpool.sim.policies import plan_for


def adaptive_plan(resolved: Resolved, sizing: str, sim_gpu: str | None, workload_rate: str) -> PoolPlan:
    """The plan `--sizing` asks for. Raises KvpoolError on a missing trace or GPU."""
    req = resolved.request
    if req.workload is None:
        raise KvpoolError(f"--sizing {sizing} needs --workload TRACE")
    if req.pool_ratio is not None:
        raise KvpoolError(f"give --pool-ratio or --sizing {sizing}, not both")
    if req.phase != "final":
        raise KvpoolError(f"--sizing {sizing} plans the final phase; drop --phase profile")
    spec, limits, kv = resolved.spec, resolved.limits, resolved.budget.kv_bytes
    trace = load_trace(req.workload)
    model = None
    rate_note: tuple[str, ...] = ()
    if sizing == "tuned":
        gpu = sim_gpu or req.budget.gpu
        if gpu is None:
            raise KvpoolError("--sizing tuned simulates step times: give --sim-gpu NAME (or --gpu)")
        model = StepTimeModel.build(spec, presets.load_gpu(gpu), load_weights(req.model.model))
        text = str(workload_rate).lower()
        if text == "trace":
            trace = trace.with_rate(None)
        else:
            try:
                rate = float(text)
            except ValueError:
                raise KvpoolError(
                    f"cannot read --workload-rate {workload_rate!r}; give requests/s, inf or trace"
                ) from None
            trace = trace.with_rate(rate)
        rate_note = (f"tuned: step times of {gpu}, arrivals at {text}" + (" (offline)" if text == "inf" else ""),)
    elif sim_gpu is not None:
        raise KvpoolError("--sim-gpu is for --sizing tuned")
    pp = plan_for(spec, limits, sizing, kv_memory_bytes=kv, trace=trace, fit=req.fit, model=model)
    return dataclasses.replace(pp.plan, notes=pp.plan.notes + pp.notes + rate_note)
