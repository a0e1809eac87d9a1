"""What a replica counts while it runs (`Tally`), and the run's `SimResult`
built from it (`result_of`): one place that counts a step, an admission and a
finish."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.sched import Scheduler, Sequence, Step
from kvpool.sim.metrics import GroupUsage, RequestRecord, SimResult
from kvpool.sim.replica_spec import CopyTime, ReplicaSpec, Setup
from kvpool.sim.transfers import PageMoves
from kvpool.sim.usage import PageUsage, group_members


@dataclass
class Tally:
    """The run's counters."""

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
    records: list[RequestRecord] = field(default_factory=list)
    hits: dict[int, int] = field(default_factory=dict)  # requests seen in a prefill: their first prefix hit
    prompt_tokens: int = 0  # the finished requests' prompt tokens, and those a hit covered at their first admission
    prompt_hits: int = 0
    prefill_tokens: int = 0  # prompt positions computed, a preempted request's recomputed ones again

    def admit(self, step: Step) -> None:
        """Each request's first prefill chunk starts where its prefix hit ended
        (a recomputed request's later lookups, which find its own pages, do
        not count); it counts when the request finishes (`finish`)."""
        for s, start, _ in step.prefills:
            if s.rid not in self.hits:
                self.hits[s.rid] = start

    def reject(self, rejected: list[Sequence]) -> None:
        """Requests rejected after their admission (alone, they still did not
        fit) drop out: the hit rate is that of the prompts served."""
        for s in rejected:
            self.hits.pop(s.rid, None)

    def count(self, sched: Scheduler, step: Step, n: int = 1) -> None:
        """`n` steps shaped like `step` ran."""
        self.steps += n
        self.prefill_tokens += n * sum(num for _, _, num in step.prefills)
        if not step.decodes:
            return
        self.decode_steps += n
        if step.prefills:
            return
        self.decode_only += n
        if step.graph:
            self.graph_steps += n
        elif step.padded_batch_size is None and sched.graphs.size_for(step.batch_size, step.draft_len) is not None:
            self.pad_fail += n  # it ran eagerly although its size has a graph: the padding dummy was missing

    def finish(self, done: list[Sequence], now: float) -> None:
        for s in done:
            s.finish_s = self.last_finish = now
            self.finished += 1
            self.out_tokens += len(s.output_ids)
            hit = self.hits.pop(s.rid, 0)
            self.prompt_tokens += s.prompt_len
            self.prompt_hits += hit
            if s.first_token_s is None:  # pragma: no cover - a finished request sampled a token
                continue
            self.ttft.append(s.first_token_s - s.arrival_s)
            if len(s.output_ids) > 1:
                self.tpot.append((now - s.first_token_s) / (len(s.output_ids) - 1))
            self.records.append(
                RequestRecord(
                    s.rid, s.arrival_s, s.first_token_s, now, s.prompt_len, len(s.output_ids),
                    hit, s.num_preemptions,
                )
            )  # fmt: skip


def result_of(
    spec: ReplicaSpec,
    setup: Setup,
    t: Tally,
    usage: PageUsage,
    *,
    submitted: int,
    rejected: int,
    first_arrival: float,
    now: float,
    wall_s: float,
    copies: CopyTime | None,
) -> SimResult:
    """The run's metrics so far."""
    plan, manager, sched, groups = spec.plan, setup.manager, setup.sched, setup.groups
    stats = manager.stats()
    pages = {
        g: GroupUsage(setup.totals[k], usage.peak[k], usage.used_time[k] / now if now > 0 else 0.0)
        for k, g in enumerate(groups)
    }
    return SimResult(
        policy=spec.label,
        plan=plan,
        num_requests=submitted,
        finished=t.finished,
        rejected=rejected,
        output_tokens=t.out_tokens,
        makespan_s=t.last_finish - first_arrival if submitted else 0.0,
        ttft_s=np.asarray(t.ttft),
        tpot_s=np.asarray(t.tpot),
        preemptions=sched.num_preemptions,
        prefill_tokens=t.prefill_tokens,
        steps=t.steps,
        decode_steps=t.decode_steps,
        decode_only_steps=t.decode_only,
        graph_steps=t.graph_steps,
        padding_failures=t.pad_fail,
        pages=pages,
        captured=len(setup.report.captured),
        skipped=len(setup.report.skipped),
        reuse_hit_rate=stats.hit_rate,
        prompt_hit_rate=t.prompt_hits / t.prompt_tokens if t.prompt_tokens else 0.0,
        wall_s=wall_s,
        end_used=dict(zip(groups, setup.used(), strict=True)),
        reserved={o: sum(stats.groups[g].reserved for g in members) for o, members in group_members(plan).items()},
        tiers=None if copies is None else tier_counts(copies.moves, sched, spec, copies.seconds),
        requests=tuple(t.records),
    )


def tier_counts(moves: PageMoves, sched: Scheduler, spec: ReplicaSpec, transfer_s: float) -> dict[str, Any]:
    """What the cold tiers did over the run: their bytes, pages onboarded
    (prefix hits copied in; resumed pages apart), offloaded, spilled to disk,
    suspensions, and the seconds the copies added to the steps."""
    resumed, suspended = sched.resumed_pages, sched.suspended_pages
    return {
        "bytes": {t.medium: t.bytes for t in spec.tiers},
        "preemption": spec.preemption,
        "pages_onboarded": sum(moves.pages_in.values()) - resumed,
        "pages_resumed": resumed,
        "pages_offloaded": sum(moves.pages_out.values()) - suspended,
        "pages_suspended": suspended,
        "pages_spilled": moves.pages_spilled,
        "suspensions": sched.num_suspensions,
        "transfer_s": transfer_s,
    }
