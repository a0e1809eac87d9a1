"""`kvpool plan --workload TRACE --sizing occupancy|tuned`: the plan of the
`occupancy` or `tuned` policy (`kvpool.sim.policies`), its assumptions added
to the plan's notes."""

from __future__ import annotations

import argparse
import dataclasses

from kvpool import presets
from kvpool.cli.budget import kv_budget
from kvpool.cli.plan_args import limits_from_args, spec_for_plan
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.presets.traces import load_trace
from kvpool.sim import StepTimeModel, load_weights
from kvpool.sim.policies import plan_for


def adaptive_plan(args: argparse.Namespace) -> PoolPlan:
    """The plan `--sizing` asks for. Raises KvpoolError on a missing trace or GPU."""
    if args.workload is None:
        raise KvpoolError(f"--sizing {args.sizing} needs --workload TRACE")
    if args.pool_ratio is not None:
        raise KvpoolError(f"give --pool-ratio or --sizing {args.sizing}, not both")
    if args.phase != "final":
        raise KvpoolError(f"--sizing {args.sizing} plans the final phase; drop --phase profile")
    spec, max_len = spec_for_plan(args)
    limits = limits_from_args(args, max_len)
    kv = kv_budget(args, limits).kv_bytes
    trace = load_trace(args.workload)
    model = None
    rate_note: tuple[str, ...] = ()
    if args.sizing == "tuned":
        gpu = args.sim_gpu or args.gpu
        if gpu is None:
            raise KvpoolError("--sizing tuned simulates step times: give --sim-gpu NAME (or --gpu)")
        model = StepTimeModel.build(spec, presets.load_gpu(gpu), load_weights(args.model))
        text = str(args.workload_rate).lower()
        if text == "trace":
            trace = trace.with_rate(None)
        else:
            try:
                rate = float(text)
            except ValueError:
                raise KvpoolError(
                    f"cannot read --workload-rate {args.workload_rate!r}; give requests/s, inf or trace"
                ) from None
            trace = trace.with_rate(rate)
        rate_note = (f"tuned: step times of {gpu}, arrivals at {text}" + (" (offline)" if text == "inf" else ""),)
    elif args.sim_gpu is not None:
        raise KvpoolError("--sim-gpu is for --sizing tuned")
    pp = plan_for(spec, limits, args.sizing, kv_memory_bytes=kv, trace=trace, fit=args.fit, model=model)
    return dataclasses.replace(pp.plan, notes=pp.plan.notes + pp.notes + rate_note)
