"""A trace replayed with online rebalancing (`kvpool.sim.rebalance`).

The same loop as `kvpool.sim.simulator.simulate` (shared scheduler, real
`KVCacheManager`, the same step-time model) run step by step (no decode
fast path), with the rebalancer consulted between steps. Pool sizes are
emulated by ballast dummies; usage figures leave the ballast out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.sched import Scheduler, Sequence
from kvpool.sim.metrics import GroupUsage, SimResult
from kvpool.sim.rebalance import BallastPools, Rebalancer, pages_for_share
from kvpool.sim.requests import OUTPUT_TOKEN, make_sequence
from kvpool.sim.steptime import StepTimeModel
from kvpool.trace import Trace


@dataclass(frozen=True)
class Move:
    """One rebalance: at `step` (simulated `time_s`), the sliding share from
    `share_from` to `share_to` (wanted `target`); pages moved per group."""

    step: int
    time_s: float
    share_from: float
    share_to: float
    target: float
    moved: dict[str, int]
    applied: bool


@dataclass
class RebalanceLog:
    moves: list[Move] = field(default_factory=list)

    def moved_pages(self) -> dict[str, int]:
        """Pages that changed pool, per group (absolute, summed over moves)."""
        out: dict[str, int] = {}
        for m in self.moves:
            for g, n in m.moved.items():
                out[g] = out.get(g, 0) + abs(n)
        return out


def simulate_rebalanced(
    plan: PoolPlan,
    trace: Trace,
    model: StepTimeModel,
    *,
    rebalancer: Rebalancer | None = None,
    dry_run: bool = False,
    padding: bool = True,
    low: float = 0.02,
    high: float = 0.98,
) -> tuple[SimResult, RebalanceLog]:
    """Replay `trace` starting from `plan`'s split, moving it online. With
    `dry_run` the split never changes and the log says what would have moved."""
    limits = plan.limits
    use_reuse = trace.hash_ids is not None
    pools = BallastPools.build(plan, low=low, high=high, enable_reuse=use_reuse)
    s = pools.sliding
    budget = sum(g.bytes for g in plan.groups)
    pools.set_sizes({g.name: g.pages for g in plan.groups}, budget)
    manager = pools.manager
    reb = rebalancer or Rebalancer(
        plan.spec,
        limits.max_seq_len,
        plan.budget_bytes,
        {g.name: g.page_bytes for g in plan.groups},
        low=low,
        high=high,
    )
    report = manager.warmup(limits.graph_batch_sizes, draft_lens=(0,))
    pads = {d: r for d, r in report.padding.items() if r is not None}
    if not padding:
        for rid in pads.values():
            manager.free(rid)
        pads = {}
    sched = Scheduler(
        manager, limits, padding=padding, captured=report.captured, padding_rids=pads, enable_reuse=use_reuse
    )
    log = RebalanceLog()
    n = len(trace)
    arrivals = (trace.arrival_s if trace.arrival_s is not None else np.zeros(n)).tolist()
    groups = [g.name for g in plan.spec.groups]
    peak = dict.fromkeys(groups, 0)
    used_time = dict.fromkeys(groups, 0.0)
    seen: set[int] = set()
    now, nxt, rejected, idle = 0.0, 0, 0, 0
    steps = decode_steps = decode_only = graph_steps = finished = out_tokens = 0
    last_finish = 0.0
    ttft: list[float] = []
    tpot: list[float] = []
    wall0 = time.perf_counter()
    share_now = plan.group(s).share
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
            finished += 1
            out_tokens += len(q.output_ids)
            if q.first_token_s is not None:
                ttft.append(q.first_token_s - q.arrival_s)
                if len(q.output_ids) > 1:
                    tpot.append((now - q.first_token_s) / (len(q.output_ids) - 1))
        target = reb.due(steps, s, share_now)
        if target is not None:
            reb.last_move = steps
            want = pages_for_share(plan, s, target)
            want = {g: max(p - 2, 1) for g, p in want.items()}  # slack for whole pages
            moved = {g: want[g] - pools.size(g) for g in groups} if dry_run else pools.set_sizes(want, budget)
            new_share = share_now if dry_run else pools.size(s) * pools.page_bytes[s] / pools.bytes_now()
            log.moves.append(Move(steps, now, share_now, new_share, target, moved, not dry_run))
            share_now = new_share
    makespan = last_finish - float(arrivals[0]) if n else 0.0
    usage = {g: GroupUsage(pools.size(g), peak[g], used_time[g] / now if now > 0 else 0.0) for g in groups}
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
    )
    return result, log
