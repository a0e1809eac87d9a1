"""The `online` policy: the `tuned` split at start-up, then tuned again between
segments of the traffic it serves, with a restart where the split changes.

An engine fixes its pool split at start-up, so a deployment that follows its
traffic restarts between parts of it. `serve_online` serves a trace in
`segments` equal parts, in arrival order:

- Segment 1 runs the `tuned` policy's split of the planning traffic
  (`kvpool.sim.tuned.tune`, the workload share among its candidates, and its
  rule: the reference split unless a candidate gains more than
  `tuned.DEFAULT_MARGIN`, 1 %, over the traffic tuned on; every later tuning
  the same way).
- Before each later segment, `tune` runs again on the `window` most recent
  requests seen: the end of the planning traffic, then the segments served
  (default: as many requests as the planning traffic). Its split (the
  candidate) and the reference split run on the segment just served beside
  the current split; the faster of the two replaces the current split only
  when it is faster there by more than `margin` (default 2 %). So it never
  switches to a split slower than the reference split on the most recent
  traffic (and the candidate was no slower than it on the traffic it was
  tuned on, `tune`'s rule); a split that has fallen behind the reference
  split by more than the margin is left; and a gain within the noise of a
  sample does not pay for a restart. The switch margin is the larger of the
  two: it is measured on one segment (a quarter of the served traffic, so
  noisier than `tune`'s sample and checks together) and must pay for the
  restart as well. When the candidate is the current split and the current
  split is the reference split, nothing is run.
- A switch is a restart: the requests of the segments before it finish (the
  engine drains) before the new split serves the next segment, and its prefix
  cache starts cold. Consecutive segments on one split are one run, with no
  restart between them. Throughput is the output tokens over the runs'
  makespans added up.

Costs: `segments` plans by `tune` (each 20 s to 5 minutes on 2 busy CPUs),
up to three runs on each served segment but the last, and the served runs.
docs/sim.md, "On traffic held out from tuning", says how it does on traces
held out from the work that set these constants.

`simulate_online` is `kvpool simulate --policy online`: one trace, planned
from its first segment and served whole, the served runs merged into one
`SimResult` (`merged_run`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.sim.metrics import GroupUsage, SimResult
from kvpool.sim.simulator import simulate
from kvpool.sim.steptime import StepTimeModel
from kvpool.sim.tuned import Tuned, tune, tuned_group, workload_shares
from kvpool.spec import ModelSpec
from kvpool.trace import Trace, concat_traces

DEFAULT_SEGMENTS = 4
DEFAULT_MARGIN = 0.02

Serve = Callable[[PoolPlan, Trace], tuple[int, float]]  # (output tokens, makespan in s)
Retune = Callable[[Trace], Tuned]


@dataclass(frozen=True)
class Decision:
    """Before segment `segment` (counted from 0): the share `tune` gave on the
    window (`candidate`) and the share adopted (`share`); on the segment just
    served, the faster of the candidate and the reference split over the
    current split (`gain`) and the candidate over the reference split
    (`vs_reference`); both 1.0 when nothing was run. `switched`: a restart."""

    segment: int
    window: int  # requests tuned on
    candidate: float
    share: float
    gain: float
    vs_reference: float
    switched: bool


@dataclass(frozen=True)
class Online:
    """A trace served online: the share of `group` each segment ran with
    (`shares`), the decisions between segments, and the totals over the runs
    (one per restart)."""

    group: str
    reference: float
    bounds: tuple[int, ...]  # segment i is requests bounds[i]:bounds[i + 1]
    shares: tuple[float, ...]
    decisions: tuple[Decision, ...]
    output_tokens: int
    makespan_s: float
    margin: float
    wall_s: float

    @property
    def restarts(self) -> int:
        return sum(d.switched for d in self.decisions)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """What `kvpool simulate --json` prints under `online`."""
        return {
            "group": self.group,
            "reference": self.reference,
            "bounds": list(self.bounds),
            "shares": list(self.shares),
            "restarts": self.restarts,
            "margin": self.margin,
            "decisions": [dataclasses.asdict(d) for d in self.decisions],
        }

    def notes(self) -> tuple[str, ...]:
        moves = ", ".join(
            f"segment {d.segment + 1}: {d.candidate:.4g} ({100 * (d.gain - 1):+.1f} % on the last segment"
            f"{', switched' if d.switched else ''})"
            for d in self.decisions
        )
        return (
            f"online: {len(self.shares)} segments, {self.group} shares "
            f"{' / '.join(f'{s:.4g}' for s in self.shares)} (reference {self.reference:.4g}), "
            f"{self.restarts} restart(s), margin {100 * self.margin:g} %; re-tuned {moves or 'never'}",
        )


def split(plan: PoolPlan) -> tuple[tuple[str, float], ...]:
    """The plan's byte shares, comparable and hashable."""
    return tuple(sorted(plan.ratio.items()))


def recent(seen: Trace, served: Trace, upto: int, window: int) -> Trace:
    """The `window` most recent requests before request `upto` of `served`:
    the end of `seen`, then `served[:upto]`."""
    from_served = min(upto, window)
    parts = []
    if window > from_served:
        parts.append(seen.span(max(0, len(seen) - (window - from_served)), len(seen)))
    if from_served:
        parts.append(served.span(upto - from_served, upto))
    return parts[0] if len(parts) == 1 else concat_traces(parts, f"{served.name} (window)")


def serve_online(
    spec: ModelSpec,
    limits: ServingLimits,
    seen: Trace,
    served: Trace,
    model: StepTimeModel | None,
    *,
    kv_memory_bytes: int,
    segments: int = DEFAULT_SEGMENTS,
    margin: float = DEFAULT_MARGIN,
    window: int | None = None,
    fit: bool = False,
    padding: bool = True,
    serve: Serve | None = None,
    retune: Retune | None = None,
) -> Online:
    """Plan from `seen`, serve `served` in `segments` parts, tuning again
    between them (module docstring). `window`: requests tuned on before each
    segment (default `len(seen)`). `serve(plan, trace)` -> (output tokens,
    makespan) and `retune(trace)` -> `Tuned` override the simulator and `tune`
    (for tests). Raises KvpoolError on bad settings or when the reference split
    does not run."""
    if segments < 1 or not 0 <= margin < 1 or len(served) < segments or len(seen) < 1:
        raise KvpoolError(
            f"online needs 1 <= segments <= served requests, 0 <= margin < 1 and planning traffic; "
            f"got {segments} segments, margin {margin}, {len(served)} served, {len(seen)} seen"
        )
    if serve is None and model is None:
        raise KvpoolError("policy online needs a step-time model (a GPU: --gpu NAME)")
    window = len(seen) if window is None else window
    if window < 1:
        raise KvpoolError(f"online needs a positive window, got {window}")
    t0 = time.perf_counter()

    def run(plan: PoolPlan, trace: Trace) -> tuple[int, float]:
        if serve is not None:
            return serve(plan, trace)
        assert model is not None
        r = simulate(plan, trace, model, padding=padding)
        return r.output_tokens, r.makespan_s

    def speed(plan: PoolPlan, trace: Trace) -> float:
        try:
            tokens, makespan = run(plan, trace)
        except KvpoolError:
            return 0.0  # a split that does not run loses every comparison
        return tokens / makespan if makespan > 0 else 0.0

    def tuned(trace: Trace) -> Tuned:
        if retune is not None:
            return retune(trace)
        steps = cast(StepTimeModel, model)  # tune reads it only through `run`
        extra = workload_shares(spec, limits, trace, kv_memory_bytes=kv_memory_bytes, fit=fit)
        return tune(
            spec,
            limits,
            trace,
            steps,
            kv_memory_bytes=kv_memory_bytes,
            fit=fit,
            padding=padding,
            run=speed,
            extra_shares=extra,
        )

    lim = dataclasses.replace(limits, avg_seq_len=None)
    reference = plan_pools(spec, lim, kv_memory_bytes=kv_memory_bytes, fit=fit)
    group = tuned_group(spec)
    bounds = tuple(round(i * len(served) / segments) for i in range(segments + 1))
    first = tuned(seen)
    plans, decisions = [first.plan], []
    for k in range(1, segments):
        current, last = plans[-1], served.span(bounds[k - 1], bounds[k])
        tuned_on = recent(seen, served, bounds[k], window)
        cand = tuned(tuned_on)
        gain = vs_ref = 1.0
        chosen = current
        if split(cand.plan) != split(current) or split(current) != split(reference):
            now = speed(current, last)
            ref = now if split(current) == split(reference) else speed(reference, last)
            known = {split(current): now, split(reference): ref}
            new = known.get(split(cand.plan)) or speed(cand.plan, last)
            vs_ref = new / ref if ref > 0 else float(new > 0)
            best, fastest = (cand.plan, new) if new >= ref else (reference, ref)
            gain = fastest / now if now > 0 else float(fastest > 0)
            chosen = best if gain > 1 + margin else current
        plans.append(chosen)
        decisions.append(
            Decision(k, len(tuned_on), cand.share, chosen.share_of(group), gain, vs_ref, chosen is not current)
        )
    tokens, makespan = 0, 0.0
    k = 0
    while k < segments:  # one run per stretch of segments on one split
        end = k + 1
        while end < segments and plans[end] is plans[k]:
            end += 1
        out, secs = run(plans[k], served.span(bounds[k], bounds[end]))
        tokens, makespan, k = tokens + out, makespan + secs, end
    return Online(
        group,
        reference.share_of(group),
        bounds,
        tuple(p.share_of(group) for p in plans),
        tuple(decisions),
        tokens,
        makespan,
        margin,
        time.perf_counter() - t0,
    )


def simulate_online(
    spec: ModelSpec,
    limits: ServingLimits,
    trace: Trace,
    model: StepTimeModel,
    *,
    kv_memory_bytes: int,
    segments: int = DEFAULT_SEGMENTS,
    fit: bool = False,
    padding: bool = True,
    admission: str | None = None,
) -> tuple[SimResult, Online]:
    """`kvpool simulate --policy online` on one trace: `serve_online` serves the
    whole `trace` in `segments` parts, planning from its first part (segment 1
    runs the split tuned on itself, as `tuned` plans on the trace it serves);
    each later segment runs the split tuned on the segment before it (the
    window is one segment). The served runs (one per restart and one more)
    are merged into one result (`merged_run`) whose `online` field is
    `Online.to_json()`. Every run, the tunings' too, admits by `admission`
    (`kvpool.sim.simulate`'s). Raises KvpoolError as `serve_online` does."""
    if len(trace) < segments:
        raise KvpoolError(f"policy online serves {segments} segments: it needs at least {segments} requests")
    runs: deque[SimResult] = deque(maxlen=segments)  # the served runs come last, at most one per segment

    def serve(plan: PoolPlan, part: Trace) -> tuple[int, float]:
        r = simulate(plan, part, model, padding=padding, policy="online", admission=admission)
        runs.append(r)
        return r.output_tokens, r.makespan_s

    seen = trace.span(0, round(len(trace) / segments))
    o = serve_online(
        spec,
        limits,
        seen,
        trace,
        model,
        kv_memory_bytes=kv_memory_bytes,
        segments=segments,
        fit=fit,
        padding=padding,
        serve=serve,
    )
    served = list(runs)[-(o.restarts + 1) :]
    return dataclasses.replace(merged_run(served), online=o.to_json()), o


def merged_run(runs: list[SimResult]) -> SimResult:
    """Runs served one after the other (an engine restarted between them) as one:
    counts, tokens, makespans and latencies added up, request times shifted by
    the makespans before them; the plan and warmup of the first run; page
    totals and peaks the highest of any run (so a peak is never above its
    total), mean pages weighted by makespan; hit rates
    weighted by finished requests; the pages left used those of the last run."""
    first, last = runs[0], runs[-1]
    span = sum(r.makespan_s for r in runs)
    done = sum(r.finished for r in runs)
    offsets = np.cumsum([0.0] + [r.makespan_s for r in runs[:-1]])
    pages = {
        g: GroupUsage(
            max(r.pages[g].total for r in runs if g in r.pages),
            max(r.pages[g].peak_used for r in runs if g in r.pages),
            sum(r.pages[g].mean_used * r.makespan_s for r in runs if g in r.pages) / span if span > 0 else 0.0,
        )
        for g in first.pages
    }

    def added(name: str) -> int:
        return sum(int(getattr(r, name)) for r in runs)

    def per_request(name: str) -> float:
        return sum(getattr(r, name) * r.finished for r in runs) / done if done else 0.0

    return dataclasses.replace(
        first,
        num_requests=added("num_requests"),
        finished=done,
        rejected=added("rejected"),
        output_tokens=added("output_tokens"),
        preemptions=added("preemptions"),
        steps=added("steps"),
        decode_steps=added("decode_steps"),
        decode_only_steps=added("decode_only_steps"),
        graph_steps=added("graph_steps"),
        padding_failures=added("padding_failures"),
        makespan_s=span,
        ttft_s=np.concatenate([r.ttft_s for r in runs]),
        tpot_s=np.concatenate([r.tpot_s for r in runs]),
        pages=pages,
        reuse_hit_rate=per_request("reuse_hit_rate"),
        prompt_hit_rate=per_request("prompt_hit_rate"),
        wall_s=sum(r.wall_s for r in runs),
        end_used=dict(last.end_used),
        reserved=dict(last.reserved),
        requests=tuple(
            dataclasses.replace(
                q, arrival_s=q.arrival_s + t, first_token_s=q.first_token_s + t, finish_s=q.finish_s + t
            )
            for r, t in zip(runs, offsets, strict=True)
            for q in r.requests
        ),
    )
