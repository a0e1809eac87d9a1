"""The `tuned` policy: a bounded search over the split, each candidate run
through the simulator on a sample of the trace.

- Sample: `sample_trace` keeps `chunks` contiguous blocks of the trace (4 by
  default) spread evenly over it, `sample` requests in all (1,000 by
  default; the whole trace when it is shorter). Contiguous blocks keep a
  conversation's prefix reuse, spread blocks keep a mix that drifts. Arrival
  times are kept within a block and the blocks are laid end to end.
- Search: over one group's byte share (the first group that is not full
  attention; the other groups keep the proportions of the start), in log-odds
  around the `occupancy` ratio: 5 points at offsets -1.6 .. +1.6 (share x about
  1/5 .. 5 near 0), then 2 rounds of halving the step around the best, plus
  the shares of `reference` and `workload`, at most `max_evals` runs
  (11 by default). Ties keep the earlier candidate (the analytical start).
- Each candidate is a plan with the same constraints as any policy (floors
  kept), so the tuned plan is always one `plan_pools` would give for that
  ratio. The objective is the sample's output tokens/s.

Costs: one run per candidate on the sample; about 1 to 8 s each on a CPU for
1,000 requests (see docs/sim.md), so 10 to 90 s per plan.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.occupancy import Occupancy
from kvpool.plan.workload import Workload
from kvpool.sim.simulator import simulate
from kvpool.sim.steptime import StepTimeModel
from kvpool.spec import ModelSpec
from kvpool.trace import Trace

DEFAULT_SAMPLE = 1000
DEFAULT_EVALS = 11
OFFSETS = (0.0, -0.8, 0.8, -1.6, 1.6)


class FixedRatio:
    """A `RatioPolicy` that returns a given ratio under a given name."""

    def __init__(self, name: str, ratio: dict[str, float]):
        self.name, self._ratio = name, dict(ratio)

    def ratio(self, spec: ModelSpec, limits: ServingLimits) -> dict[str, float]:
        return dict(self._ratio)


@dataclass(frozen=True)
class Tuned:
    """The search's outcome: the plan, every candidate (share, sample tok/s)
    in the order run, and what it assumed."""

    plan: PoolPlan
    group: str
    share: float
    evals: tuple[tuple[float, float], ...]
    sample_size: int
    wall_s: float

    def notes(self) -> tuple[str, ...]:
        best = max(v for _, v in self.evals)
        return (
            f"tuned: {len(self.evals)} simulator runs on a {self.sample_size}-request sample "
            f"of the trace; best {self.group} share {self.share:.4g} at "
            f"{best:,.0f} tok/s on the sample; start: occupancy ratio",
        )


def sample_trace(trace: Trace, size: int = DEFAULT_SAMPLE, chunks: int = 4) -> Trace:
    """`size` requests in `chunks` contiguous blocks spread over `trace` (the
    whole trace when it is no longer). Blocks are laid end to end in time."""
    n = len(trace)
    if size < 1 or chunks < 1:
        raise KvpoolError(f"a sample needs a positive size and chunk count, got {size}, {chunks}")
    if n <= size:
        return trace
    chunks = min(chunks, size)
    block = size // chunks
    starts = [round(i * (n - block) / max(chunks - 1, 1)) for i in range(chunks)]
    idx = np.concatenate([np.arange(s, s + block) for s in starts])
    arrivals = None
    if trace.arrival_s is not None:
        parts, offset = [], 0.0
        for s in starts:
            t = trace.arrival_s[s : s + block] - trace.arrival_s[s]
            parts.append(t + offset)
            gap = float(np.diff(trace.arrival_s[s : s + block]).mean()) if block > 1 else 0.0
            offset += float(t[-1]) + gap
        arrivals = np.concatenate(parts)
    return replace(
        trace,
        name=f"{trace.name} (sample {len(idx)})",
        prompt_len=trace.prompt_len[idx],
        output_len=trace.output_len[idx],
        arrival_s=arrivals,
        hash_ids=None if trace.hash_ids is None else tuple(trace.hash_ids[i] for i in idx),
    )


def tuned_group(spec: ModelSpec) -> str:
    """The group whose share is searched: the first that is not full attention."""
    return next((g.name for g in spec.groups if g.kind != "full"), spec.groups[0].name)


def _with_share(ratio: dict[str, float], group: str, share: float) -> dict[str, float]:
    rest = 1.0 - ratio[group]
    out = {
        k: (v / rest * (1 - share) if rest > 0 else (1 - share) / (len(ratio) - 1))
        for k, v in ratio.items()
        if k != group
    }
    out[group] = share
    return out


def tune(
    spec: ModelSpec,
    limits: ServingLimits,
    trace: Trace,
    model: StepTimeModel,
    *,
    kv_memory_bytes: int,
    fit: bool = False,
    padding: bool = True,
    sample: int = DEFAULT_SAMPLE,
    max_evals: int = DEFAULT_EVALS,
    extra_shares: tuple[float, ...] = (),
    run: Callable[[PoolPlan, Trace], float] | None = None,
) -> Tuned:
    """Search the split (module docstring). `extra_shares`: more candidates
    (e.g. the reference and workload shares), tried after the first grid.
    `run(plan, trace)` -> tok/s overrides the simulator (for tests).
    Raises KvpoolError when no candidate gives a feasible plan."""
    if max_evals < 1:
        raise KvpoolError(f"max_evals must be positive, got {max_evals}")
    lim = dataclasses.replace(limits, avg_seq_len=None)
    start = Occupancy(trace.lengths()).ratio(spec, lim)
    group = tuned_group(spec)
    sub = sample_trace(trace, sample)
    evaluate = run or (lambda plan, t: simulate(plan, t, model, padding=padding).output_tokens_per_s)
    seen: dict[float, float] = {}
    order: list[tuple[float, float]] = []
    plans: dict[float, PoolPlan] = {}
    t0 = time.perf_counter()

    def plan_at(share: float) -> PoolPlan:
        ratio = start if share == start[group] else _with_share(start, group, share)
        return plan_pools(spec, lim, kv_memory_bytes=kv_memory_bytes, policy=FixedRatio("tuned", ratio), fit=fit)

    def score(share: float) -> None:
        share = float(f"{min(max(share, 1e-4), 1 - 1e-4):.4g}")
        if share in seen or len(order) >= max_evals:
            return
        try:
            plan = plan_at(share)
            value = evaluate(plan, sub)
        except KvpoolError:
            plan, value = None, -math.inf  # an infeasible split: never the best
        seen[share] = value
        order.append((share, value))
        if plan is not None:
            plans[share] = plan

    if len(spec.groups) < 2:
        plan = plan_at(start[group])
        return Tuned(plan, group, start[group], (), len(sub), 0.0)
    x0 = math.log(start[group] / (1 - start[group])) if 0 < start[group] < 1 else 0.0

    def share_of(x: float) -> float:
        return 1 / (1 + math.exp(-x))

    for off in OFFSETS:
        score(share_of(x0 + off))
    for s in extra_shares:
        score(s)
    step = OFFSETS[2] / 2
    for _ in range(2):
        best = max(order, key=lambda sv: sv[1])[0]
        xb = math.log(best / (1 - best))
        score(share_of(xb - step))
        score(share_of(xb + step))
        step /= 2
    best_share, best_value = max(order, key=lambda sv: sv[1])
    if best_value == -math.inf:
        raise KvpoolError(
            f"tuned: no split of {group} between {min(seen):.3g} and {max(seen):.3g} gives a feasible plan"
        )
    return Tuned(plans[best_share], group, best_share, tuple(order), len(sub), time.perf_counter() - t0)


def plan_adaptive(
    spec: ModelSpec,
    limits: ServingLimits,
    policy: str,
    trace: Trace,
    model: StepTimeModel | None,
    *,
    kv_memory_bytes: int,
    fit: bool = False,
    padding: bool = True,
) -> tuple[PoolPlan, tuple[str, ...]]:
    """The `occupancy` or `tuned` plan and notes on what it assumed. `tuned`
    also tries the `reference` and `workload` shares on the sample."""
    lim = dataclasses.replace(limits, avg_seq_len=None)
    occ = Occupancy(trace.lengths())
    notes = (occ.assumptions(lim),)
    if policy == "occupancy":
        return plan_pools(spec, lim, kv_memory_bytes=kv_memory_bytes, policy=occ, fit=fit), notes
    if model is None:
        raise KvpoolError("policy tuned needs a step-time model (a GPU: --gpu NAME)")
    group = tuned_group(spec)
    extra = []
    if len(spec.groups) > 1:
        extra.append(plan_pools(spec, lim, kv_memory_bytes=kv_memory_bytes, fit=fit).group(group).share)
        extra.append(
            plan_pools(spec, lim, kv_memory_bytes=kv_memory_bytes, fit=fit, policy=Workload(trace.lengths()))
            .group(group)
            .share
        )
    result = tune(
        spec, limits, trace, model, kv_memory_bytes=kv_memory_bytes, fit=fit, padding=padding, extra_shares=tuple(extra)
    )
    return result.plan, notes + result.notes()
