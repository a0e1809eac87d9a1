"""A trace replayed with online rebalancing (`kvpool.sim.rebalance`).

The loop of `kvpool.sim.replica.Replica` itself, with a hook
(`StepHook`): run step by step (no decode fast path), with the rebalancer
consulted between steps. Pool sizes are
emulated by ballast dummies (`kvpool.sim.ballast`); usage figures leave the
ballast out.

A move that cannot finish at once (the shrinking pool's pages are in use)
stays pending: after every step, before the next is scheduled, the pages the
finished and shrunk requests left free are taken for the move, so a full pool
drains into the other one without preempting anything. A new target replaces
a pending one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvpool.plan import PoolPlan
from kvpool.sched import Scheduler, Sequence, Step
from kvpool.sim.ballast import BallastPools, pages_for_share
from kvpool.sim.metrics import SimResult
from kvpool.sim.rebalance import Rebalancer
from kvpool.sim.replica_spec import Setup
from kvpool.sim.simulator import simulate
from kvpool.sim.steptime import StepTimeModel
from kvpool.trace import Trace


@dataclass
class Move:
    """One rebalance, started at `step` (simulated `time_s`): the sliding
    share from `share_from` towards `target`, reached `share_to` so far;
    pages moved per group (positive: the pool grew), summed over the steps it
    took; `done_step`: when it reached its target (None: never, or replaced).
    In a dry run nothing moves and `moved` is what the move would have moved."""

    step: int
    time_s: float
    share_from: float
    target: float
    share_to: float
    moved: dict[str, int]
    applied: bool
    done_step: int | None = None


@dataclass
class RebalanceLog:
    """The moves of one run; `group`: the group whose share `Move` gives."""

    group: str = "sliding"
    moves: list[Move] = field(default_factory=list)

    def moved_pages(self) -> dict[str, int]:
        """Pages that changed pool, per group (absolute, summed over moves)."""
        out: dict[str, int] = {}
        for m in self.moves:
            for g, n in m.moved.items():
                out[g] = out.get(g, 0) + abs(n)
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "moves": len(self.moves),
            "pages_moved": self.moved_pages(),
            "dry_run": any(not m.applied for m in self.moves),
            "log": [
                {
                    "step": m.step,
                    "time_s": m.time_s,
                    "share_from": m.share_from,
                    "target": m.target,
                    "share_to": m.share_to,
                    "moved": m.moved,
                    "done_step": m.done_step,
                }
                for m in self.moves
            ],
        }


def simulate_rebalanced(
    plan: PoolPlan,
    trace: Trace,
    model: StepTimeModel,
    *,
    rebalancer: Rebalancer | None = None,
    dry_run: bool = False,
    padding: bool = True,
    reuse: bool = True,
    on_step: Callable[[BallastPools], None] | None = None,
) -> tuple[SimResult, RebalanceLog]:
    """Replay `trace` starting from `plan`'s split, moving it online (see the
    module docstring). With `dry_run` the split never changes and the log
    says what would have moved. `reuse`: prefix reuse (as `simulate`'s). `on_step` sees the pools after every step
    (tests check the invariants there)."""
    limits = plan.limits
    reb = rebalancer or Rebalancer(plan)
    pools = BallastPools.build(plan, low=reb.low, high=reb.high, enable_reuse=reuse)
    manager = pools.manager
    report = manager.warmup(limits.graph_batch_sizes, draft_lens=(0,))
    pads = {d: r for d, r in report.padding.items() if r is not None}
    if not padding:
        for rid in pads.values():
            manager.free(rid)
        pads = {}
    sched = Scheduler(manager, limits, padding=padding, captured=report.captured, padding_rids=pads, enable_reuse=reuse)
    log = RebalanceLog(pools.sliding)
    groups = [g.name for g in plan.spec.groups]
    hook = _RebalanceHook(pools, reb, Mover(plan, pools, reb, log, dry_run), groups, on_step)
    setup = Setup(manager, sched, report, groups, [pools.size(g) for g in groups], hook.used)
    result = simulate(plan, trace, model, padding=padding, reuse=reuse, hook=hook, setup=setup)
    usage = {g: replace(result.pages[g], total=hook.largest[g]) for g in groups}
    result = replace(
        result,
        policy="rebalance" + (" (dry run)" if dry_run else ""),
        padding_failures=0,
        pages=usage,
        reserved={},
        rebalance=log.to_json(),
    )
    return result, log


class _RebalanceHook:
    """The loop's hook (`simulator.StepHook`): feeds the rebalancer what was
    admitted and finished, moves pages after each step, and tracks the
    largest size each pool had (reported as its pages)."""

    def __init__(
        self,
        pools: BallastPools,
        reb: Rebalancer,
        mover: Mover,
        groups: list[str],
        on_step: Callable[[BallastPools], None] | None,
    ):
        self.pools, self.reb, self.mover, self.groups, self.on_step = pools, reb, mover, groups, on_step
        self.largest = dict.fromkeys(groups, 0)
        self.seen: set[int] = set()

    def used(self) -> list[int]:
        """Used pages per group, ballast left out."""
        return [self.pools.size(g) - self.pools.manager.free_pages(g) for g in self.groups]

    def scheduled(self, step: Step) -> None:
        for g in self.groups:
            self.largest[g] = max(self.largest[g], self.pools.size(g))
        for seq, _, _ in step.prefills:
            if seq.rid not in self.seen:
                self.seen.add(seq.rid)
                self.reb.observe(seq.prompt_len, seq.max_new_tokens)

    def finished(self, seq: Sequence) -> None:
        self.reb.finished(len(seq.output_ids))

    def after_step(self, steps: int, now: float) -> None:
        self.mover.after_step(steps, now)
        if self.on_step is not None:
            self.on_step(self.pools)


class Mover:
    """Starts moves when the rebalancer says so and carries a pending one
    on, step by step, as pages come free (module docstring)."""

    def __init__(self, plan: PoolPlan, pools: BallastPools, reb: Rebalancer, log: RebalanceLog, dry_run: bool):
        self.plan, self.pools, self.reb, self.log, self.dry_run = plan, pools, reb, log, dry_run
        self.share = pools.share(pools.sliding)  # the split the decisions see (virtual in a dry run)
        self.virtual = pools.sizes()  # a dry run's pool sizes had its moves been made
        self.pending: dict[str, int] | None = None

    def after_step(self, step: int, now: float) -> None:
        s = self.pools.sliding
        target = self.reb.due(step, s, self.share)
        if target is not None:
            want = pages_for_share(self.plan, s, target)
            move = Move(step, now, self.share, target, self.share, {g: 0 for g in want}, not self.dry_run)
            self.log.moves.append(move)
            if self.dry_run:
                move.moved = {g: want[g] - self.virtual[g] for g in want}
                self.virtual = want
                move.share_to = self.share = target
                move.done_step = step
                return
            self.pending = want
        if self.pending is None:
            return
        move = self.log.moves[-1]
        moved, reached = self.pools.set_sizes(self.pending)
        for g, k in moved.items():
            move.moved[g] += k
        self.share = move.share_to = self.pools.share(s)
        if reached:
            move.done_step, self.pending = step, None
