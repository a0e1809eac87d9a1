"""What one simulated replica is made of, as a value (`ReplicaSpec`), and what
building it gives (`Setup`: manager, scheduler, warmup report, the groups
results report; `CopyTime`: the cost of the cold tiers' copies).

A spec holds no state: `build_setup(spec)` makes a fresh session each time, so
one spec can be simulated any number of times (`kvpool.sim.Replica(spec)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpool.cache import KVCacheManager, TierSpec, WarmupReport
from kvpool.engines.registry import admission_of
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.sched import Scheduler, session
from kvpool.sched.admission import Admission
from kvpool.sim.steptime import StepTimeModel
from kvpool.sim.transfers import Link, PageMoves
from kvpool.sim.usage import reported_groups


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica: `plan` (its pools and limits), `model` (its step times),
    and how it runs. `policy`: the label results carry (default the plan's).
    `reuse`: prefix reuse on. `padding=False` drops the persistent padding
    dummies that warmup reserves (engines that allocate them lazily).
    `admission`: the scheduler's admission rule (`sched/admission.py`;
    default: the engine's for an `engine:*` plan, else optimistic). `tiers`:
    cold tiers below the GPU pools, whose copies cost `link` time on top of
    each step's (`sim/transfers.py`; required with tiers). `preemption`:
    "recompute" or "suspend" (a victim's pages go to a cold tier and come
    back; needs tiers). `fast`: runs of identical decode-only steps advance in
    one computation (`sched.advance_decodes`). `hash_lookahead`: each page's
    digest also covers the L ids after it (`KVCacheManager`; vLLM 0.33 with an
    EAGLE-family drafter). Checked when built."""

    plan: PoolPlan
    model: StepTimeModel
    policy: str | None = None
    reuse: bool = False
    padding: bool = True
    admission: str | None = None
    tiers: tuple[TierSpec, ...] = ()
    link: Link | None = None
    preemption: str = "recompute"
    fast: bool = True
    hash_lookahead: int = 0

    def __post_init__(self) -> None:
        if self.preemption not in ("recompute", "suspend"):
            raise KvpoolError(f"preemption is 'recompute' or 'suspend', got {self.preemption!r}")
        if (self.tiers or self.preemption == "suspend") and (self.link is None or not self.tiers):
            raise KvpoolError("cold tiers need a link (sim/transfers.py), preemption by suspension needs a tier")

    @property
    def label(self) -> str:
        return self.policy or self.plan.policy


@dataclass(frozen=True)
class Setup:
    """A session (manager, scheduler, warmup report) and the reported groups,
    their pages and a function giving their used pages now. `build_setup`
    makes one from a spec; a variant of the loop (online rebalancing) builds
    its own."""

    manager: KVCacheManager
    sched: Scheduler
    report: WarmupReport
    groups: list[str]
    totals: list[int]
    used: Callable[[], list[int]]


@dataclass
class CopyTime:
    """The cold tiers' copies: a step (or a run of steps) waits for the pages
    the manager moved between the GPU and the tiers meanwhile (`link`)."""

    moves: PageMoves
    link: Link
    seconds: float = 0.0  # what the copies added to the steps

    def charge(self, compute_s: float) -> float:
        """The step's time with this step's onboards, offloads, suspends and resumes."""
        dt = self.link.step_seconds(compute_s, self.moves.take())
        self.seconds += dt - compute_s
        return dt


def build_setup(spec: ReplicaSpec, *, events: bool = False) -> tuple[Setup, CopyTime | None]:
    """A fresh session for `spec`: manager (recording KV events only with
    `events`), scheduler (suspending victims with `preemption="suspend"`),
    warmup report and reported groups; the tiers' copies when there are tiers."""
    plan = spec.plan
    rule = spec.admission or admission_of(plan.policy)
    manager, sched, report = session(
        plan,
        enable_reuse=spec.reuse,
        padding=spec.padding,
        admission=rule,
        tiers=spec.tiers,
        events=events,
        hash_lookahead=spec.hash_lookahead,
    )
    assert report is not None  # warmup ran
    groups, totals, used = reported_groups(plan, manager)
    copies = None
    if spec.tiers:
        assert spec.link is not None  # the spec checked
        copies = CopyTime(PageMoves([g.slot_bytes for g in plan.spec.groups]), spec.link)
        manager.set_tier_copies(copies.moves)
    if spec.preemption == "suspend":
        sched = Scheduler(
            manager,
            plan.limits,
            padding=spec.padding,
            captured=list(report.captured),
            padding_rids={d: rid for d, rid in report.padding.items() if rid is not None},
            enable_reuse=spec.reuse,
            admission=Admission.named(rule, plan.spec.groups),
            preemption="suspend",
        )
    return Setup(manager, sched, report, groups, totals, used), copies
