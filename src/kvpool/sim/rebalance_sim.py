"""A trace replayed with online rebalancing (`kvpool.sim.rebalance`).

The same loop as `kvpool.sim.simulator.simulate` (shared scheduler, real
`KVCacheManager`, the same step-time model) run step by step (no decode
fast path), with the rebalancer consulted between steps. Pool sizes are
emulated by ballast dummies (`kvpool.sim.ballast`); usage figures leave the
ballast out.

A move that cannot finish at once (the shrinking pool's pages are in use)
stays pending: after every step, before the next is scheduled, the pages the
finished and shrunk requests left free are taken for the move, so a full pool
drains into the other one without preempting anything. A new target replaces
a pending one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.sched import Scheduler, Sequence
from kvpool.sim.ballast import BallastPools, pages_for_share
from kvpool.sim.metrics import GroupUsage, SimResult
from kvpool.sim.rebalance import Rebalancer
from kvpool.sim.requests import OUTPUT_TOKEN, make_sequence
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
    on_step: Callable[[BallastPools], None] | None = None,
) -> tuple[SimResult, RebalanceLog]:
    """Replay `trace` starting from `plan`'s split, moving it online (see the
    module docstring). With `dry_run` the split never changes and the log
    says what would have moved. `on_step` sees the pools after every step
    (tests check the invariants there)."""
    limits = plan.limits
    use_reuse = trace.hash_ids is not None
    reb = rebalancer or Rebalancer(plan)
    pools = BallastPools.build(plan, low=reb.low, high=reb.high, enable_reuse=use_reuse)
    manager = pools.manager
    report = manager.warmup(limits.graph_batch_sizes, draft_lens=(0,))
    pads = {d: r for d, r in report.padding.items() if r is not None}
    if not padding:
        for rid in pads.values():
            manager.free(rid)
        pads = {}
    sched = Scheduler(
        manager, limits, padding=padding, captured=report.captured, padding_rids=pads, enable_reuse=use_reuse
    )
    log = RebalanceLog(pools.sliding)
    n = len(trace)
    arrivals = (trace.arrival_s if trace.arrival_s is not None else np.zeros(n)).tolist()
    groups = [g.name for g in plan.spec.groups]
    peak = dict.fromkeys(groups, 0)
    largest = dict.fromkeys(groups, 0)  # reported as the pool's pages: the most it had
    used_time = dict.fromkeys(groups, 0.0)
    seen: set[int] = set()
    now, nxt, rejected, idle = 0.0, 0, 0, 0
    steps = decode_steps = decode_only = graph_steps = finished = out_tokens = 0
    last_finish = 0.0
    ttft: list[float] = []
    tpot: list[float] = []
    wall0 = time.perf_counter()
    mover = Mover(plan, pools, reb, log, dry_run)
    while True:
        while nxt < n and arrivals[nxt] <= now and len(sched.waiting) < 2 * limits.max_batch_size:
            seq = make_sequence(trace, nxt, limits.max_seq_len)
            nxt += 1
            if seq is None:
                rejected += 1
            else:
                sched.add(seq)
        if not sched.has_work():
            if nxt >= n:
                break
            now = max(now, arrivals[nxt])
            continue
        step = sched.schedule()
        if step is None:  # pragma: no cover - has_work() was checked
            break
        rejected += len(step.rejected)
        if step.is_empty:
            idle += 1
            if idle > 2:
                raise KvpoolError("simulation made no progress: no request can be scheduled")
            continue
        idle = 0
        for seq, _, _ in step.prefills:
            if seq.rid not in seen:
                seen.add(seq.rid)
                reb.observe(seq.prompt_len, seq.max_new_tokens)
        dt = model.step_time(step)
        for g in groups:
            used = pools.size(g) - manager.free_pages(g)
            peak[g] = max(peak[g], used)
            largest[g] = max(largest[g], pools.size(g))
            used_time[g] += used * dt
        now += dt
        steps += 1
        if step.decodes:
            decode_steps += 1
            if not step.prefills:
                decode_only += 1
                graph_steps += bool(step.graph)
        sampled = {q.rid: [OUTPUT_TOKEN] for q, _ in step.decodes}
        for q, start, num in step.prefills:
            if start + num == q.num_tokens:
                sampled[q.rid] = [OUTPUT_TOKEN]
        done: list[Sequence] = sched.update(step, sampled)
        for q, _, _ in step.prefills:
            if q.first_token_s is None and q.output_ids:
                q.first_token_s = now
        for q in done:
            q.finish_s = last_finish = now
            reb.finished(len(q.output_ids))
            finished += 1
            out_tokens += len(q.output_ids)
            if q.first_token_s is not None:
                ttft.append(q.first_token_s - q.arrival_s)
                if len(q.output_ids) > 1:
                    tpot.append((now - q.first_token_s) / (len(q.output_ids) - 1))
        mover.after_step(steps, now)
        if on_step is not None:
            on_step(pools)
    makespan = last_finish - float(arrivals[0]) if n else 0.0
    usage = {g: GroupUsage(largest[g], peak[g], used_time[g] / now if now > 0 else 0.0) for g in groups}
    result = SimResult(
        policy="rebalance" + (" (dry run)" if dry_run else ""),
        plan=plan,
        num_requests=n,
        finished=finished,
        rejected=rejected,
        output_tokens=out_tokens,
        makespan_s=makespan,
        ttft_s=np.asarray(ttft),
        tpot_s=np.asarray(tpot),
        preemptions=sched.num_preemptions,
        steps=steps,
        decode_steps=decode_steps,
        decode_only_steps=decode_only,
        graph_steps=graph_steps,
        padding_failures=0,
        pages=usage,
        captured=len(report.captured),
        skipped=len(report.skipped),
        wall_s=time.perf_counter() - wall0,
        end_used={g: pools.size(g) - manager.free_pages(g) for g in groups},
        reuse_hit_rate=manager.stats().hit_rate,
        rebalance=log.to_json(),
    )
    return result, log


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
