"""`simulate`: a trace replayed through one replica (`kvpool.sim.replica`).

The pieces: the step-time model (`steptime`: seconds per step), the event
loop (`replica.Replica`: a clock, arrivals, steps, fast-forwarded decode
runs), the policies it applies (the shared scheduler's admission and
preemption, `sched/`; the sizing policy is the plan's) and the run as a value
(`replica_spec.ReplicaSpec` in, `metrics.SimResult` out). `simulate` is one
replica fed the whole trace and run to the end; a fleet feeds several.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.cache import KVCacheManager, TierSpec
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.sim.metrics import SimResult
from kvpool.sim.replica import Progress, Replica, StepHook
from kvpool.sim.replica_spec import ReplicaSpec, Setup
from kvpool.sim.requests import TraceRequest
from kvpool.sim.steptime import StepTimeModel
from kvpool.sim.transfers import Link
from kvpool.trace import Trace

TierSpecs = tuple[TierSpec, ...] | list[TierSpec]

__all__ = ["Progress", "Setup", "StepHook", "replay", "simulate"]


def simulate(
    plan: PoolPlan,
    trace: Trace,
    model: StepTimeModel,
    *,
    policy: str | None = None,
    padding: bool = True,
    reuse: bool = True,
    progress: Callable[[Progress], None] | None = None,
    progress_every: int = 2000,
    fast: bool = True,
    check: bool = False,
    on_step: Callable[[KVCacheManager], None] | None = None,
    hook: StepHook | None = None,
    setup: Setup | None = None,
    admission: str | None = None,
    tiers: TierSpecs = (),
    link: Link | None = None,
    preemption: str = "recompute",
    hash_lookahead: int = 0,
) -> SimResult:
    """Replay `trace` (arrival times already set, see `Trace.with_rate`)
    against `plan`: `replay` of one `Replica` of the `ReplicaSpec` these
    options make (see it for `policy`, `padding`, `admission`, `tiers`,
    `link`, `preemption`, `fast`, `hash_lookahead`). `reuse`: prefix reuse,
    on by default as in every simulated engine (without hash ids each prompt
    is unique, `sim/requests.py`: a preempted request finds only its own
    pages); False recomputes a preempted request from token 0. Returns the run's metrics; the plan is not changed.
    `check` runs the manager's integrity check at the end (O(pages); for
    tests). `on_step` is called with the manager after each step, or each
    fast-forwarded run (e.g. to publish its events: the manager records them
    only then). `hook` and `setup` are for variants of the loop
    (`rebalance_sim`)."""
    if setup is not None and (tiers or preemption == "suspend"):
        raise KvpoolError("cold tiers need a link (sim/transfers.py), preemption by suspension needs a tier")
    spec = ReplicaSpec(
        plan,
        model,
        policy=policy,
        reuse=reuse,
        padding=padding,
        admission=admission,
        tiers=tuple(tiers),
        link=link,
        preemption=preemption,
        fast=fast,
        hash_lookahead=hash_lookahead,
    )
    replica = Replica(spec, setup=setup, hook=hook, on_step=on_step, progress=progress, progress_every=progress_every)
    return replay(replica, trace, check=check)


def replay(replica: Replica, trace: Trace, *, check: bool = False) -> SimResult:
    """Submit every request of `trace` to `replica` at its arrival time (all
    at 0 without times), run it to the end and return its result; `check`
    runs the manager's integrity check at the end."""
    arrivals = trace.arrival_s.tolist() if trace.arrival_s is not None else [0.0] * len(trace)
    for i, t in enumerate(arrivals):
        replica.submit(TraceRequest.of(trace, i), t)
    replica.run_until(float("inf"))
    if check:
        replica.manager.check_integrity()
    return replica.result()
