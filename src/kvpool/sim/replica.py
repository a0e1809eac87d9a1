"""One simulated replica, stepped by its caller: the discrete-event loop.

A `Replica` is a manager and the shared scheduler (built from a
`ReplicaSpec`) with a clock. Requests are submitted with their arrival times
and queue outside the scheduler until the clock reaches them; `run_until(t)`
then runs every step that starts before `t`. Each step: requests that have
arrived join the scheduler's queue (at most `2 * max_batch_size` waiting
there; the rest wait outside it), the scheduler picks the step (resizing
pages in the manager), the clock advances by the step's modelled time
(`steptime`), every row samples one token, and the scheduler applies it
(finished requests free their pages). An idle replica's clock jumps to the
next arrival, never past `t`.

Fast-forward: a decode-only step that would repeat unchanged (no arrival,
finish, page shortage, preemption or admission before it ends) runs with the
identical steps after it in one computation (`sched.advance_decodes`), up to
the first finish, the next arrival (unless the queue's head waits through
the run) and `t`. The clock adds the step times one by one
(`itertools.accumulate`), so a run cut anywhere gives the same times as one run.

No randomness: a replica fed the same requests at the same times gives the
same result however its caller slices time (`kvpool.sim.simulate` is one
replica fed a whole trace).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol

import numpy as np

from kvpool.cache.kv_wire import wire_events
from kvpool.errors import KvpoolError
from kvpool.sched import Scheduler, Sequence, Step, advance_decodes, decode_run_limit
from kvpool.sim.metrics import SimResult
from kvpool.sim.replica_spec import ReplicaSpec, Setup, build_setup
from kvpool.sim.requests import OUTPUT_TOKEN, TraceRequest
from kvpool.sim.tally import Tally, result_of
from kvpool.sim.usage import PageUsage, growing_pages, run_growth


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
    step. A hooked replica goes step by step (no fast-forward)."""

    def scheduled(self, step: Step) -> None: ...

    def finished(self, seq: Sequence) -> None: ...

    def after_step(self, steps: int, now: float) -> None: ...


@dataclass(frozen=True)
class ReplicaLoad:
    """What a router may know of a replica now: requests `waiting` (submitted,
    not admitted: queued, suspended, or not yet arrived at the replica's
    clock) and `running`; per reported group its `free_pages` and
    `total_pages`; `prefill_tokens`, the prompt tokens submitted or admitted
    and not yet computed."""

    waiting: int
    running: int
    free_pages: Mapping[str, int]
    total_pages: Mapping[str, int]
    prefill_tokens: int

    @property
    def usage(self) -> float:
        """The largest share of used pages over the groups (0 to 1)."""
        return max((1 - self.free_pages[g] / n for g, n in self.total_pages.items() if n), default=0.0)


class Replica:
    """One replica's manager and scheduler on a clock (module docstring).

    Not thread-safe. Every method but `next_event_s`, `load` and `result`
    changes the replica: `submit` queues, `run_until` runs steps (pages,
    clock, counters), `drain_events` empties the event buffer. `setup` and
    `hook` are for variants of the loop (`rebalance_sim`: a session it built,
    called between steps; not with cold tiers). `on_step` is called with the
    manager after each step or fast-forwarded run; `progress` every
    `progress_every` single steps."""

    def __init__(
        self,
        spec: ReplicaSpec,
        *,
        name: str = "0",
        events: bool = False,
        setup: Setup | None = None,
        hook: StepHook | None = None,
        on_step: Callable[[Any], None] | None = None,
        progress: Callable[[Progress], None] | None = None,
        progress_every: int = 2000,
    ) -> None:
        if setup is not None and spec.tiers:
            raise KvpoolError("a replica with cold tiers builds its own session")
        self.spec, self.name, self.events = spec, name, events
        self.copies = None
        if setup is None:
            setup, self.copies = build_setup(spec, events=events or on_step is not None)
        self.setup, self.manager, self.sched = setup, setup.manager, setup.sched
        self.hook, self.on_step = hook, on_step
        self.progress, self.progress_every = progress, progress_every
        self.fast = spec.fast and hook is None
        self.now = 0.0
        self.pending: deque[tuple[TraceRequest, float]] = deque()  # submitted, not yet in the scheduler's queue
        self.submitted = 0
        self.rejected = 0
        self.first_arrival = 0.0
        self.wall_s = 0.0
        self.tally = Tally()
        self.usage = PageUsage(len(setup.groups))
        self._idle_steps = 0
        self._wall0 = 0.0  # when the current `run_until` began
        self._cap = 2 * spec.plan.limits.max_batch_size
        self._growing = growing_pages(spec.plan, setup.groups)  # (`run_growth`)

    # ------------------------------------------------------------------ the interface

    def submit(self, request: TraceRequest, arrival_s: float) -> None:
        """Queue `request` (side effect: the replica's queue), arriving at
        `arrival_s`; it joins the scheduler's queue when the clock reaches
        that time, in submission order (one whose prompt leaves no room under
        `max_seq_len` is then rejected). An arrival before the clock joins at
        the next step, as a request arriving during a step does."""
        if not self.submitted:
            self.first_arrival = arrival_s
        self.submitted += 1
        self.pending.append((request, arrival_s))

    def next_event_s(self) -> float | None:
        """Simulated time of the next step (the clock, when there is work) or
        of the next arrival; None when idle with nothing submitted. No side effects."""
        if self.sched.has_work():
            return self.now
        return max(self.now, self.pending[0][1]) if self.pending else None

    def run_until(self, t_s: float) -> None:
        """Run every step that starts before `t_s` (side effects: pages,
        scheduler, clock, counters; the clock may pass `t_s` by the last
        step's time, never while idle). `run_until(inf)` runs to the end of
        what was submitted. Raises KvpoolError when no request can be scheduled."""
        self._wall0 = wall0 = time.perf_counter()
        sched = self.sched
        while True:
            self._feed()
            if not sched.has_work():
                if not self.pending or self.pending[0][1] >= t_s:
                    break
                self.now = max(self.now, self.pending[0][1])
                continue
            if self.now >= t_s:
                break
            self._step(t_s)
        self.wall_s += time.perf_counter() - wall0

    def load(self) -> ReplicaLoad:
        """The replica's queue and pages now (no side effects)."""
        sched, setup = self.sched, self.setup
        waiting = [*sched.waiting, *sched.suspended]
        queued = sum(s.num_tokens - s.num_computed for s in waiting)
        queued += sum(s.num_pending for s in sched.running if not s.is_decoding)
        queued += sum(r.prompt_len for r, _ in self.pending)
        free = [n - u for n, u in zip(setup.totals, setup.used(), strict=True)]
        return ReplicaLoad(
            len(waiting) + len(self.pending),
            len(sched.running),
            dict(zip(setup.groups, free, strict=True)),
            dict(zip(setup.groups, setup.totals, strict=True)),
            queued,
        )

    def drain_events(self) -> list[Any]:
        """The KV events since the last call, oldest first, as vLLM publishes
        them (BlockStored / BlockRemoved, `cache.kv_wire.wire_events`, what
        `kvpool.index` and the fleet's routers read); empties the buffer.
        Always empty for a replica built with `events=False` (none recorded)."""
        if not self.events:
            return []
        return wire_events(self.manager.take_events(), self.spec.plan.spec.groups)

    def result(self) -> SimResult:
        """The run so far as a `SimResult` (per-request records in
        `requests`); call it after `run_until(inf)` for the whole run. No side effects."""
        return result_of(
            self.spec,
            self.setup,
            self.tally,
            self.usage,
            submitted=self.submitted,
            rejected=self.rejected,
            first_arrival=self.first_arrival,
            now=self.now,
            wall_s=self.wall_s,
            copies=self.copies,
        )

    # ------------------------------------------------------------------ the loop

    def _feed(self) -> None:
        """Arrived requests join the scheduler's queue (at most `_cap` waiting)."""
        pending, sched = self.pending, self.sched
        max_len = self.spec.plan.limits.max_seq_len
        while pending and pending[0][1] <= self.now and len(sched.waiting) < self._cap:
            request, arrival = pending.popleft()
            seq = request.sequence(arrival, max_len)
            if seq is None:
                self.rejected += 1
            else:
                sched.add(seq)

    def _step(self, horizon: float) -> None:
        """One step, or a fast-forwarded run of decode steps that start before
        the next arrival and `horizon`."""
        sched, hook = self.sched, self.hook
        step = sched.schedule()
        if step is None:  # pragma: no cover - has_work() was checked
            return
        self.rejected += len(step.rejected)
        self.tally.reject(step.rejected)
        if step.is_empty:
            self._idle_steps = 0 if step.rejected else self._idle_steps + 1  # a rejection is progress
            if self._idle_steps > 2:
                raise KvpoolError("simulation made no progress: no request can be scheduled")
            return
        self._idle_steps = 0
        if hook is not None:
            hook.scheduled(step)
        used_now = self.setup.used()
        self.usage.peak_at(used_now)
        if self.fast and not sched.suspended and self._fast_forward(step, used_now, horizon):
            return
        compute = self.spec.model.step_time(step)
        dt = compute if self.copies is None else self.copies.charge(compute)
        self.usage.step(used_now, dt)
        self.now += dt
        self.tally.count(sched, step)
        self.tally.admit(step)
        done = _sample(sched, step, self.now)
        self.tally.finish(done, self.now)
        if hook is not None:
            for q in done:
                hook.finished(q)
            hook.after_step(self.tally.steps, self.now)
        if self.on_step is not None:
            self.on_step(self.manager)
        if self.progress is not None and self.tally.steps % self.progress_every == 0:
            done_n = self.tally.finished + self.rejected
            wall = self.wall_s + time.perf_counter() - self._wall0
            self.progress(Progress(self.spec.label, done_n, self.submitted, self.now, wall))

    def _fast_forward(self, step: Step, used_now: list[int], horizon: float) -> bool:
        """Run `step` and the identical steps after it at once, up to the
        first finish, while they start before `horizon` and before the next
        arrival (a request arriving during a step joins at the next one;
        when the queue's head waits through the run, `sched.waits_through`,
        arrivals queue behind it and join after the run).
        False (nothing changed) when fewer than two steps would run."""
        sched = self.sched
        limit = most = decode_run_limit(sched, step)
        if limit < 2:
            return False
        times = self.spec.model.decode_run_times(
            [s.num_computed for s, _ in step.decodes], limit, graph=step.graph, padded_batch=step.padded_batch_size
        ).tolist()  # (a run's few steps: plain floats cost less than NumPy's calls)
        # an arrival ends the run, unless the head of the queue waits through it (an arrival then queues behind)
        stop = min(self.pending[0][1], horizon) if self.pending and not sched.waiting else horizon
        ends = list(accumulate(times, initial=self.now))  # ends[j]: the clock after j steps, added one by one
        limit = bisect_left(ends, stop, 1, limit)  # steps 2.. start where the one before ends
        if limit < 2:
            return False
        caps = [self.manager.capacity(s.rid) for s, _ in step.decodes]
        used_after: list[int] = []
        run = advance_decodes(
            sched, step, limit, OUTPUT_TOKEN, limit=most, on_extended=lambda: used_after.extend(self.setup.used())
        )
        if run is None:
            return False
        limit, done = run  # (a run ends early where a verbatim repeat fills its twin's page: `shared_fill_limit`)
        end = ends[limit]
        times = times[:limit]
        if self.copies is not None:  # the run waits for the copies made meanwhile (none: it ends as without tiers)
            compute = float(np.sum(times))  # (NumPy's pairwise sum, not `sum`'s one by one)
            end += self.copies.charge(compute) - compute
        growth: list[list[int] | None]
        if end == ends[limit]:
            growth = run_growth(self._growing, caps, limit)
        else:  # the copies' time is the run's, not its steps'
            growth, times = [None] * len(used_now), [end - self.now]
        self.usage.run(used_now, used_after, times, growth)
        self.now = end
        self.tally.count(sched, step, limit)
        self.tally.finish(done, end)
        if self.on_step is not None:
            self.on_step(self.manager)
        return True


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
