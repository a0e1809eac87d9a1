"""The discrete-event loop: a trace replayed through the shared scheduler and
the real `KVCacheManager`, with step times from `steptime`.

Each iteration: requests that have arrived join the queue, the scheduler picks
the step (resizing pages in the manager), the clock advances by the step's
modelled time, every row samples one token, and the scheduler applies it
(finished requests free their pages). When nothing is running the clock jumps
to the next arrival. No randomness: a run is a pure function of its inputs
(the arrival times of a Poisson `--rate` are drawn, seeded, by the trace).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvpool.cache import KVCacheManager, TierSpec, WarmupReport
from kvpool.engines.registry import admission_of
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.sched import Scheduler, Sequence, Step, advance_decodes, decode_run_limit, session
from kvpool.sched.admission import Admission
from kvpool.sim.metrics import GroupUsage, SimResult
from kvpool.sim.requests import OUTPUT_TOKEN, make_sequence
from kvpool.sim.steptime import StepTimeModel
from kvpool.sim.transfers import Link, PageMoves
from kvpool.sim.usage import PageUsage, group_members, reported_groups
from kvpool.trace import Trace

TierSpecs = tuple[TierSpec, ...] | list[TierSpec]


@dataclass(frozen=True)
class Progress:
    """Handed to the progress callback every `progress_every` steps."""

    policy: str
    done: int
    total: int
    sim_time_s: float
    wall_s: float


class StepHook(Protocol):
    """What a variant of the loop (online rebalancing) adds to it: called
    when a step was scheduled, for each finished request, and after each
    step (before `on_step`). A hooked run goes step by step (no fast path)."""

    def scheduled(self, step: Step) -> None: ...

    def finished(self, seq: Sequence) -> None: ...

    def after_step(self, steps: int, now: float) -> None: ...


@dataclass(frozen=True)
class Setup:
    """A session the caller built (manager, scheduler, warmup report) and the
    reported groups, their pages and a function giving their used pages now;
    None in `simulate`: its own `session` and `reported_groups`."""

    manager: KVCacheManager
    sched: Scheduler
    report: WarmupReport
    groups: list[str]
    totals: list[int]
    used: Callable[[], list[int]]


@dataclass
class _Tally:
    """The run's counters; one place that counts a step and a finish."""

    steps: int = 0
    decode_steps: int = 0
    decode_only: int = 0
    graph_steps: int = 0
    pad_fail: int = 0
    finished: int = 0
    out_tokens: int = 0
    last_finish: float = 0.0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    admitted: set[int] = field(default_factory=set)  # requests seen in a prefill
    prompt_tokens: int = 0  # their prompts' tokens, and those a prefix hit covered at their first admission
    prompt_hits: int = 0

    def admit(self, step: Step) -> None:
        """Each request's first prefill chunk starts where its prefix hit ended
        (a recomputed request's later lookups, which find its own pages, do not count)."""
        for s, start, _ in step.prefills:
            if s.rid not in self.admitted:
                self.admitted.add(s.rid)
                self.prompt_tokens += s.prompt_len
                self.prompt_hits += start

    def count(self, sched: Scheduler, step: Step, n: int = 1) -> None:
        """`n` steps shaped like `step` ran."""
        self.steps += n
        if not step.decodes:
            return
        self.decode_steps += n
        if step.prefills:
            return
        self.decode_only += n
        if step.graph:
            self.graph_steps += n
        elif step.padded_batch_size is None and _needs_padding(sched, step):
            self.pad_fail += n

    def finish(self, done: list[Sequence], now: float) -> None:
        for s in done:
            s.finish_s = self.last_finish = now
            self.finished += 1
            self.out_tokens += len(s.output_ids)
            _record(s, self.ttft, self.tpot)


def simulate(
    plan: PoolPlan,
    trace: Trace,
    model: StepTimeModel,
    *,
    policy: str | None = None,
    padding: bool = True,
    reuse: bool | None = None,
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
) -> SimResult:
    """Replay `trace` (arrival times already set, see `Trace.with_rate`)
    against `plan`. `padding=False` drops the persistent padding dummies that
    warmup reserves (engines that allocate them lazily); `reuse` defaults to on
    when the trace has prefix hash ids. Returns the run's metrics; the plan is
    not changed. `fast` runs stretches of identical decode-only steps with one
    manager call (`sched.advance_decodes`); the result is the same up to
    floating-point rounding. `check` runs the manager's integrity check at
    the end (O(pages); for tests). `on_step` is called with the manager after
    each step, or each stretch of decode steps (e.g. to publish its events).
    `hook` and `setup` are for variants of the loop (`rebalance_sim`).
    `admission`: the scheduler's admission rule (`sched/admission.py`);
    default: the engine's for an `engine:*` plan, else optimistic.
    `tiers`: cold tiers below the GPU pools (host memory, disk); the pages the
    manager moves to and from them cost `link` time on top of each step's
    (`sim/transfers.py`; `link` is required with tiers). `preemption`:
    "recompute" (default) or "suspend" (a victim's pages go to a cold tier
    and come back, `Scheduler(preemption="suspend")`; needs tiers)."""
    _check_tiers(tiers, link, setup, preemption)
    copies = None
    if setup is None:
        use_reuse = trace.hash_ids is not None if reuse is None else reuse
        setup, copies = _setup(plan, use_reuse, padding, admission, tiers, link, preemption)
    manager, sched = setup.manager, setup.sched
    fast = fast and hook is None
    n = len(trace)
    arrivals = trace.arrival_s if trace.arrival_s is not None else np.zeros(n)
    arrival_list = arrivals.tolist()
    usage = PageUsage(len(setup.groups))
    feed = _Feed(trace, arrival_list, plan.limits.max_seq_len, 2 * plan.limits.max_batch_size)
    now = 0.0
    idle_steps = 0
    tally = _Tally()
    wall0 = time.perf_counter()

    while True:
        feed.until(now, sched)
        if not sched.has_work():
            if feed.nxt >= n:
                break
            now = max(now, arrival_list[feed.nxt])
            continue
        step = sched.schedule()
        if step is None:  # pragma: no cover - has_work() was checked
            break
        feed.rejected += len(step.rejected)
        if step.is_empty:
            idle_steps += 1
            if idle_steps > 2:
                raise KvpoolError("simulation made no progress: no request can be scheduled")
            continue
        idle_steps = 0
        if hook is not None:
            hook.scheduled(step)
        used_now = setup.used()
        usage.peak_at(used_now)
        if (
            fast
            and not _suspended(sched)
            and (run := _decode_run(sched, step, model, now, arrival_list, feed.nxt, setup.used))
        ):
            times, done, used_after = run
            dt = float(times.sum()) if copies is None else copies.charge(float(times.sum()))
            usage.run(used_now, used_after, dt)
            now += dt
            tally.count(sched, step, len(times))
            tally.finish(done, now)
            if on_step is not None:
                on_step(manager)
            continue
        dt = model.step_time(step) if copies is None else copies.charge(model.step_time(step))
        usage.step(used_now, dt)
        now += dt
        tally.count(sched, step)
        tally.admit(step)
        done = _sample(sched, step, now)
        tally.finish(done, now)
        if hook is not None:
            for q in done:
                hook.finished(q)
            hook.after_step(tally.steps, now)
        if on_step is not None:
            on_step(manager)
        if progress is not None and tally.steps % progress_every == 0:
            progress(
                Progress(policy or plan.policy, tally.finished + feed.rejected, n, now, time.perf_counter() - wall0)
            )

    if check:
        manager.check_integrity()
    return _result(plan, policy, setup, tally, usage, feed.rejected, n, arrivals, now, wall0, copies, tiers, preemption)


def _check_tiers(tiers: TierSpecs, link: Link | None, setup: Setup | None, preemption: str) -> None:
    """Tiers need a link and `simulate`'s own session; suspension needs a tier."""
    if preemption not in ("recompute", "suspend"):
        raise KvpoolError(f"preemption is 'recompute' or 'suspend', got {preemption!r}")
    if (tiers or preemption == "suspend") and (link is None or setup is not None or not tiers):
        raise KvpoolError("cold tiers need a link (sim/transfers.py), preemption by suspension needs a tier")


@dataclass
class _Copies:
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


@dataclass
class _Feed:
    """The trace's requests, handed to the scheduler as they arrive (at most
    `cap` waiting: the rest wait outside the queue); too-long ones are rejected."""

    trace: Trace
    arrivals: list[float]
    max_seq_len: int
    cap: int
    nxt: int = 0
    rejected: int = 0

    def until(self, now: float, sched: Scheduler) -> None:
        n = len(self.arrivals)
        while self.nxt < n and self.arrivals[self.nxt] <= now and len(sched.waiting) < self.cap:
            seq = make_sequence(self.trace, self.nxt, self.max_seq_len)
            self.nxt += 1
            if seq is None:
                self.rejected += 1
            else:
                sched.add(seq)


def _setup(
    plan: PoolPlan,
    reuse: bool,
    padding: bool,
    admission: str | None,
    tiers: TierSpecs,
    link: Link | None,
    preemption: str,
) -> tuple[Setup, _Copies | None]:
    """`simulate`'s own session: manager, scheduler (suspending victims with
    `preemption="suspend"`), warmup report and reported groups; the tiers'
    copies when there are tiers."""
    rule = admission or admission_of(plan.policy)
    manager, sched, report = session(plan, enable_reuse=reuse, padding=padding, admission=rule, tiers=tiers)
    assert report is not None  # warmup ran
    groups, totals, used = reported_groups(plan, manager)
    copies = None
    if tiers:
        assert link is not None  # `simulate` checked
        copies = _Copies(PageMoves([g.slot_bytes for g in plan.spec.groups]), link)
        manager.set_tier_copies(copies.moves)
    if preemption == "suspend":
        sched = _suspending(plan, manager, report, padding=padding, reuse=reuse, rule=rule)
    return Setup(manager, sched, report, groups, totals, used), copies


def _sample(sched: Scheduler, step: Step, now: float) -> list[Sequence]:
    """Every row that completes its tokens samples one; the scheduler applies
    them (finished requests free their pages); returns the finished ones."""
    one = [OUTPUT_TOKEN]
    sampled = {s.rid: one for s, _ in step.decodes}
    for s, start, num in step.prefills:
        if start + num == s.num_tokens:
            sampled[s.rid] = one
    done = sched.update(step, sampled)
    for s, _, _ in step.prefills:
        if s.first_token_s is None and s.output_ids:
            s.first_token_s = now
    return done


def _result(
    plan: PoolPlan,
    policy: str | None,
    setup: Setup,
    t: _Tally,
    usage: PageUsage,
    rejected: int,
    n: int,
    arrivals: np.ndarray,
    now: float,
    wall0: float,
    copies: _Copies | None,
    tiers: TierSpecs,
    preemption: str,
) -> SimResult:
    """The run's metrics."""
    manager, sched, report, groups = setup.manager, setup.sched, setup.report, setup.groups
    makespan = t.last_finish - float(arrivals[0]) if n else 0.0
    stats = manager.stats()
    pages = {
        g: GroupUsage(setup.totals[k], usage.peak[k], usage.used_time[k] / now if now > 0 else 0.0)
        for k, g in enumerate(groups)
    }
    return SimResult(
        policy=policy or plan.policy,
        plan=plan,
        num_requests=n,
        finished=t.finished,
        rejected=rejected,
        output_tokens=t.out_tokens,
        makespan_s=makespan,
        ttft_s=np.asarray(t.ttft),
        tpot_s=np.asarray(t.tpot),
        preemptions=sched.num_preemptions,
        steps=t.steps,
        decode_steps=t.decode_steps,
        decode_only_steps=t.decode_only,
        graph_steps=t.graph_steps,
        padding_failures=t.pad_fail,
        pages=pages,
        captured=len(report.captured),
        skipped=len(report.skipped),
        reuse_hit_rate=stats.hit_rate,
        prompt_hit_rate=t.prompt_hits / t.prompt_tokens if t.prompt_tokens else 0.0,
        wall_s=time.perf_counter() - wall0,
        end_used=dict(zip(groups, setup.used(), strict=True)),
        reserved={o: sum(stats.groups[g].reserved for g in members) for o, members in group_members(plan).items()},
        tiers=None if copies is None else _tier_counts(copies.moves, sched, tiers, copies.seconds, preemption),
    )


def _suspending(
    plan: PoolPlan, manager: KVCacheManager, report: WarmupReport, *, padding: bool, reuse: bool, rule: str
) -> Scheduler:
    """The scheduler `session` built, with preemption by suspension (the same
    captured shapes, padding dummies and admission rule)."""
    return Scheduler(
        manager,
        plan.limits,
        padding=padding,
        captured=list(report.captured),
        padding_rids={d: rid for d, rid in report.padding.items() if rid is not None},
        enable_reuse=reuse,
        admission=Admission.named(rule, plan.spec.groups),
        preemption="suspend",
    )


def _suspended(sched: Scheduler) -> bool:
    """Requests wait suspended: step by step, so that each step may resume them."""
    return bool(sched.suspended)


def _tier_counts(
    moves: PageMoves, sched: Scheduler, tiers: TierSpecs, transfer_s: float, preemption: str
) -> dict[str, Any]:
    """What the cold tiers did over the run: their bytes, pages onboarded
    (prefix hits copied in; resumed pages apart), offloaded, spilled to disk,
    suspensions, and the seconds the copies added to the steps."""
    resumed, suspended = sched.resumed_pages, sched.suspended_pages
    return {
        "bytes": {t.medium: t.bytes for t in tiers},
        "preemption": preemption,
        "pages_onboarded": sum(moves.pages_in.values()) - resumed,
        "pages_resumed": resumed,
        "pages_offloaded": sum(moves.pages_out.values()) - suspended,
        "pages_suspended": suspended,
        "pages_spilled": moves.pages_spilled,
        "suspensions": sched.num_suspensions,
        "transfer_s": transfer_s,
    }


def _decode_run(
    sched: Scheduler,
    step: Step,
    model: StepTimeModel,
    now: float,
    arrivals: list[float],
    nxt: int,
    used: Callable[[], list[int]],
) -> tuple[np.ndarray, list[Sequence], list[int]] | None:
    """Run `step` and the identical steps after it at once, up to the first
    finish and not past the next arrival (a request arriving during a step
    joins at the next one). Returns (per-step times, finished, used pages per
    reported group during the last step) or None."""
    limit = decode_run_limit(sched, step)
    if limit < 2:
        return None
    times = model.decode_run_times(
        [s.num_computed for s, _ in step.decodes], limit, graph=step.graph, padded_batch=step.padded_batch_size
    )
    if nxt < len(arrivals):
        starts = now + np.cumsum(times[:-1])  # start times of steps 2..limit
        limit = 1 + int(np.searchsorted(starts, arrivals[nxt], side="left"))
        if limit < 2:
            return None
        times = times[:limit]
    used_after: list[int] = []

    def measure() -> None:
        used_after.extend(used())

    done = advance_decodes(sched, step, limit, OUTPUT_TOKEN, on_extended=measure)
    return None if done is None else (times, done, used_after)


def _needs_padding(sched: Scheduler, step: Step) -> bool:
    """A decode-only step ran eagerly although its batch size has a captured
    graph to pad to: the padding dummy was missing."""
    return sched.graphs.size_for(step.batch_size, step.draft_len) is not None


def _record(seq: Sequence, ttft: list[float], tpot: list[float]) -> None:
    if seq.first_token_s is None or seq.finish_s is None:
        return
    ttft.append(seq.first_token_s - seq.arrival_s)
    if len(seq.output_ids) > 1:
        tpot.append((seq.finish_s - seq.first_token_s) / (len(seq.output_ids) - 1))
