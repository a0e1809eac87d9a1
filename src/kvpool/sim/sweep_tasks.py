"""`simulate --sweep-ratio ... --workers N`: the sweep's splits as tasks for
`kvpool.sim.serial_or_ray` (Ray when installed, else serial). Each task carries
its plan, trace and step model, and returns the run or the reason it could
not run, so that results come back in share order, as a serial loop's would."""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sim.metrics import SimResult
from kvpool.sim.policies import plan_for, ratio_policy
from kvpool.sim.serial_or_ray import Bar, run_all
from kvpool.sim.simulator import simulate
from kvpool.sim.steptime import StepTimeModel
from kvpool.spec import ModelSpec
from kvpool.trace import Trace


@dataclass(frozen=True)
class SimTask:
    """One run: a plan replayed on a trace (picklable)."""

    label: str
    plan: PoolPlan
    trace: Trace
    model: StepTimeModel
    padding: bool = True


def run_task(task: SimTask) -> SimResult | str:
    """The run, or the KvpoolError's message when it cannot run."""
    try:
        return simulate(task.plan, task.trace, task.model, policy=task.label, padding=task.padding)
    except KvpoolError as e:
        return str(e)


def run_shares(
    spec: ModelSpec,
    limits: ServingLimits,
    group: str,
    shares: list[float],
    trace: Trace,
    model: StepTimeModel,
    *,
    kv_memory_bytes: int,
    fit: bool = False,
    padding: bool = True,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
) -> tuple[list[tuple[float, SimResult]], list[str]]:
    """The `ratio:GROUP=SHARE` runs of a sweep, in share order, and notes (skipped
    shares, how the points ran)."""
    notes: list[str] = []
    tasks: list[tuple[float, SimTask]] = []
    for share in shares:
        policy = ratio_policy(group, share)
        try:
            pp = plan_for(spec, limits, policy, kv_memory_bytes=kv_memory_bytes, fit=fit)
        except KvpoolError as e:
            notes.append(f"share {share:g} of {group} skipped: {e}")
            continue
        tasks.append((share, SimTask(policy, pp.plan, trace, model, padding)))
    bar = Bar(len(tasks), "sweep", enabled=progress)
    try:
        results, how = run_all(
            run_task,
            [t for _, t in tasks],
            workers=workers,
            ray_address=ray_address,
            bar=bar,
            describe=lambda t: t.label,
        )
    finally:
        bar.close()
    out = []
    for (share, _), r in zip(tasks, results, strict=True):
        if isinstance(r, str):
            notes.append(f"share {share:g} of {group} skipped: {r}")
        else:
            out.append((share, r))
    return out, notes + [how]
