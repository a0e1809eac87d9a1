"""The fleet's event loop: replicas behind routers, advanced in time order.

A fleet is one or two stages of replicas, each stage behind its own router:
one aggregated stage, or a prefill stage whose finished prompts are handed to
a decode stage over a link (`Handoffs`). Every replica is a steppable
simulator replica (`FleetReplica`: `kvpool.sim.Replica` is one); the loop
never steps a scheduler itself. It repeatedly takes the earliest of

- the next arrival (a trace request, or a handoff whose transfer is done):
  the stage's router picks a replica at that time, the request is submitted;
- the replica whose next event is the earliest (`next_event_s`): it runs
  until then, and the loop harvests what happened: its KV events go to the
  router (which applies them `event_lag_s` later), requests whose first token
  came out are `prefilled`, finished ones `finished` (and, out of a prefill
  stage, handed off).

An arrival at the same time as a replica's next step is submitted first, as
the one-replica simulator admits a request that arrived by the step's start.
The loop is deterministic: ties between replicas go to the lower stage and
index, between arrivals to the earlier one in trace order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpool.fleet.load import RouteRequest
from kvpool.fleet.metrics import ReplicaSummary, RequestRecord
from kvpool.fleet.routers import Router
from kvpool.sched import Sequence as Request
from kvpool.sched.sequence import Status
from kvpool.sim.metrics import SimResult
from kvpool.sim.requests import make_sequence
from kvpool.trace import Trace

DONE = (Status.FINISHED, Status.REJECTED)


class FleetReplica(Protocol):
    """What the loop needs of a replica (`kvpool.sim.Replica` provides it).
    `submit` hands it a request that arrived at `arrival_s` (the replica sets
    the request's `first_token_s`, `finish_s` and `status` as it runs it);
    `next_event_s` is the time of its next step (None when idle);
    `run_until(t)` runs what happens up to `t`; `drain_events` returns and
    clears the KV events since the last call; `result` is its run's metrics."""

    def submit(self, request: Request, arrival_s: float) -> None: ...

    def next_event_s(self) -> float | None: ...

    def run_until(self, t_s: float) -> None: ...

    def drain_events(self) -> list[Any]: ...

    def result(self) -> SimResult: ...


@dataclass
class Stage:
    """Replicas of one role behind one router. The loop's books: the requests
    in flight on each replica, and those whose first token is not out yet."""

    role: str  # "aggregated", "prefill" or "decode"
    replicas: Sequence[FleetReplica]
    router: Router
    inflight: list[dict[int, Request]] = field(init=False)
    unprefilled: list[set[int]] = field(init=False)
    requests: list[int] = field(init=False)
    prompt_tokens: list[int] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.replicas)
        if n != self.router.workers:
            raise ValueError(f"{self.role} stage: {n} replicas behind a router of {self.router.workers}")
        self.inflight = [{} for _ in range(n)]
        self.unprefilled = [set() for _ in range(n)]
        self.requests = [0] * n
        self.prompt_tokens = [0] * n


@dataclass(frozen=True)
class Transfer:
    """A handoff: `seconds` on the link, `pages` per group the decode side
    receives (`fleet.handoff`)."""

    seconds: float
    pages: Mapping[str, int]


@dataclass
class Handoffs:
    """How a prefill stage hands a prompt to the decode stage: `transfer`
    gives the transfer of a prompt of L tokens. The transfers in flight to
    each decode replica, (start, end, pages), are kept for the decode side's
    headroom (`peak_pages`)."""

    transfer: Callable[[int], Transfer]
    in_flight: dict[int, list[tuple[float, float, Mapping[str, int]]]] = field(default_factory=dict)

    def peak_pages(self, worker: int) -> dict[str, int]:
        """Per group, the most pages in flight to `worker` at once (each group's own peak)."""
        spans = self.in_flight.get(worker, [])
        groups = sorted({g for _, _, pages in spans for g in pages})
        peaks = {}
        for g in groups:
            # ends before starts at equal times: a transfer that ends as another starts does not overlap it
            edges = sorted([(s, 1, p[g]) for s, _, p in spans] + [(e, 0, -p[g]) for _, e, p in spans])
            level = peak = 0
            for _, _, d in edges:
                level += d
                peak = max(peak, level)
            peaks[g] = peak
        return peaks


@dataclass
class Fleet:
    """The stages and the books of one run (`run_fleet`)."""

    stages: list[Stage]
    handoffs: Handoffs | None
    records: dict[int, RequestRecord] = field(default_factory=dict)
    arrivals: list[tuple[float, int, int, int, int]] = field(default_factory=list)  # (t, order, stage, worker, rid)
    due: list[tuple[float, int, int]] = field(default_factory=list)  # (t, stage, worker): a heap, stale entries kept
    next_due: dict[tuple[int, int], float | None] = field(default_factory=dict)
    order: int = 0
    decode_requests: dict[int, Request] = field(default_factory=dict)

    def arrive(self, t: float, stage: int, worker: int, rid: int) -> None:
        heapq.heappush(self.arrivals, (t, self.order, stage, worker, rid))
        self.order += 1

    def refresh(self, s: int, w: int) -> None:
        """Re-read replica (s, w)'s next event into the heap."""
        t = self.stages[s].replicas[w].next_event_s()
        if self.next_due.get((s, w)) != t:
            self.next_due[(s, w)] = t
            if t is not None:
                heapq.heappush(self.due, (t, s, w))

    def next_replica(self) -> tuple[float, int, int] | None:
        """The earliest replica event still current (stale entries dropped)."""
        while self.due:
            t, s, w = self.due[0]
            if self.next_due.get((s, w)) == t:
                return t, s, w
            heapq.heappop(self.due)
        return None


def run_fleet(
    trace: Trace,
    stages: Sequence[Stage],
    *,
    max_seq_len: int,
    handoffs: Handoffs | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[RequestRecord], list[ReplicaSummary]]:
    """Replay `trace` (arrival times set) on the fleet: `stages` is one
    aggregated stage, or a prefill and a decode stage with `handoffs`.
    Returns every request's record (trace order) and every replica's summary
    (stage order). `progress(done, total)` is called as requests finish."""
    if (len(stages) == 2) != (handoffs is not None) or len(stages) not in (1, 2):
        raise ValueError("a fleet is one aggregated stage, or a prefill and a decode stage with handoffs")
    fleet = Fleet(list(stages), handoffs)
    n = len(trace)
    arrivals = trace.arrival_s.tolist() if trace.arrival_s is not None else [0.0] * n
    requests: dict[int, Request] = {}
    for i in range(n):
        seq = make_sequence(trace, i, max_seq_len)
        out = int(trace.output_len[i])
        rec = RequestRecord(i, arrivals[i], int(trace.prompt_len[i]), out)
        fleet.records[i] = rec
        if seq is None:
            rec.rejected = True
            continue
        rec.output_len = seq.max_new_tokens
        if handoffs is not None:
            seq.max_new_tokens = 1  # the prefill stage samples the first token, then hands the request on
        requests[i] = seq
        fleet.arrive(arrivals[i], 0, -1, i)
    done = sum(r.rejected for r in fleet.records.values())
    while True:
        nxt = fleet.next_replica()
        if fleet.arrivals and (nxt is None or fleet.arrivals[0][0] <= nxt[0]):
            t, _, s, w, rid = heapq.heappop(fleet.arrivals)
            seq = requests[rid] if s == 0 else fleet.decode_requests.pop(rid)
            submit(fleet, s, w, seq, t)
            continue
        if nxt is None:
            break
        t, s, w = nxt
        fleet.stages[s].replicas[w].run_until(t)
        finished = harvest(fleet, s, w, t)
        fleet.refresh(s, w)
        if finished and progress is not None:
            done += finished
            progress(done, n)
    return [fleet.records[i] for i in range(n)], summaries(fleet)


def submit(fleet: Fleet, s: int, w: int, seq: Request, t: float) -> None:
    """Route `seq` in stage `s` at time `t` (unless already routed to `w`) and hand it to its replica."""
    stage = fleet.stages[s]
    if w < 0:
        w = stage.router.route(RouteRequest(seq.rid, seq.prompt_ids, seq.salt), t)
    stage.replicas[w].submit(seq, t)
    stage.inflight[w][seq.rid] = seq
    stage.unprefilled[w].add(seq.rid)
    stage.requests[w] += 1
    stage.prompt_tokens[w] += seq.prompt_len
    rec = fleet.records[seq.rid]
    if stage.role == "prefill":
        rec.prefill_worker = w
    else:
        rec.worker = w
    fleet.refresh(s, w)


def harvest(fleet: Fleet, s: int, w: int, now: float) -> int:
    """What replica (s, w) did up to `now`: events to the router, first tokens,
    finishes (handed off out of a prefill stage). Returns the requests the
    fleet finished (or rejected)."""
    stage = fleet.stages[s]
    router = stage.router
    events = stage.replicas[w].drain_events()
    if events:
        router.observe(w, events, now)
    inflight = stage.inflight[w]
    for rid in [r for r in stage.unprefilled[w] if inflight[r].first_token_s is not None or inflight[r].status in DONE]:
        stage.unprefilled[w].discard(rid)
        router.prefilled(rid, now)
    ended = [seq for seq in inflight.values() if seq.status in DONE]
    finished = 0
    for seq in ended:
        del inflight[seq.rid]
        stage.unprefilled[w].discard(seq.rid)
        router.finished(seq.rid, now)
        rec = fleet.records[seq.rid]
        if seq.status is Status.REJECTED:
            rec.rejected = True
            finished += 1
        elif stage.role == "prefill" and rec.output_len > 1:
            hand_off(fleet, seq, now)
        else:
            if rec.first_token_s is None:
                rec.first_token_s = seq.first_token_s
            rec.finish_s = seq.finish_s
            finished += 1
    return finished


def hand_off(fleet: Fleet, seq: Request, now: float) -> None:
    """`seq`'s prompt is computed (its first token sampled) on a prefill
    replica: route it in the decode stage now, and have it arrive there once
    its pages crossed the link. On the decode replica it continues at its
    prompt (whose compute the decode step model does not charge:
    `fleet.steps.DecodeSteps`), its first token being the decode replica's first."""
    handoffs = fleet.handoffs
    assert handoffs is not None and seq.finish_s is not None
    start = seq.finish_s
    transfer = handoffs.transfer(seq.prompt_len)
    rec = fleet.records[seq.rid]
    rec.transfer_s = transfer.seconds
    decode = fleet.stages[1]
    w = decode.router.route(RouteRequest(seq.rid, seq.prompt_ids, seq.salt), now)
    end = start + transfer.seconds
    handoffs.in_flight.setdefault(w, []).append((start, end, transfer.pages))
    fleet.decode_requests[seq.rid] = Request(
        rid=seq.rid, prompt_ids=seq.prompt_ids, max_new_tokens=rec.output_len, salt=seq.salt, arrival_s=end
    )
    fleet.arrive(max(end, now), 1, w, seq.rid)


def summaries(fleet: Fleet) -> list[ReplicaSummary]:
    out = []
    for stage in fleet.stages:
        for w, rep in enumerate(stage.replicas):
            peak = fleet.handoffs.peak_pages(w) if fleet.handoffs is not None and stage.role == "decode" else {}
            out.append(ReplicaSummary(w, stage.role, stage.requests[w], stage.prompt_tokens[w], rep.result(), peak))
    return out
