"""The fleet's event loop: replicas behind routers, advanced in time order.

A fleet is one or two stages of replicas, each stage behind its own router:
one aggregated stage, or a prefill stage whose finished prompts are handed to
a decode stage over a link (`Handoffs`). Every replica is a steppable
simulator replica (`FleetReplica`; `fleet.replicas.StageReplica` over
`kvpool.sim.Replica`); the loop never steps a scheduler itself.

Replicas meet only where a router decides: at an arrival. So the loop takes
the next arrival (a trace request; or, in the decode stage, a prompt whose
prefill is done, and its delivery once its pages crossed the link), advances
every replica with work to that time (`run_until(t)`: the steps that start
before t), and collects what they did as timed news: KV events (at the
replica's clock after the run), first tokens, finishes, rejections. The
router then hears the news up to t, in time order (the kv router applies an
event `event_lag_s` after it was emitted), and routes the arrival. A replica
never sees a request before its arrival time, a router never hears of
anything after the time it routes at. An arrival at the same time as a
replica's next step is submitted first, as the one-replica simulator admits a
request that arrived by the step's start.

Deterministic: news at equal times in the order collected (stage, replica
index), arrivals at equal times in trace order.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpool.fleet.load import RouteRequest
from kvpool.fleet.metrics import FleetRecord, ReplicaSummary
from kvpool.fleet.routers import Router
from kvpool.sim.metrics import RequestRecord, SimResult
from kvpool.sim.requests import TraceRequest
from kvpool.trace import Trace


class FleetReplica(Protocol):
    """What the loop needs of a replica: `kvpool.sim.Replica`'s interface
    (`submit` a request arriving at `arrival_s`; `next_event_s`, the time of
    its next step, None when idle; `run_until(t)`; `drain_events`, the KV
    events since the last call; `result`) and three questions about what it
    did (`fleet.replicas.StageReplica` answers them from the replica's own
    books): `take_finished`, the records of the requests finished since the
    last call; `take_rejected`, the ids of those it rejected since;
    `first_tokens(rids)`, which of `rids` have sampled their first token, and
    when; `clock_s`, its clock (the end of the last step it ran)."""

    def submit(self, request: TraceRequest, arrival_s: float) -> None: ...

    def next_event_s(self) -> float | None: ...

    def run_until(self, t_s: float) -> None: ...

    def drain_events(self) -> list[Any]: ...

    def result(self) -> SimResult: ...

    def take_finished(self) -> list[RequestRecord]: ...

    def take_rejected(self) -> list[int]: ...

    def first_tokens(self, rids: set[int]) -> list[tuple[int, float]]: ...

    def clock_s(self) -> float: ...


@dataclass
class Stage:
    """Replicas of one role behind one router. The loop's books: the requests
    in flight on each replica, and those whose first token is not out yet."""

    role: str  # "aggregated", "prefill" or "decode"
    replicas: Sequence[FleetReplica]
    router: Router
    inflight: list[dict[int, TraceRequest]] = field(init=False)
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
    """The stages and the books of one run (`run_fleet`): every request's
    record, the timed entries still to process (`queue`: routing a decode
    request, delivering one), the news the routers have not heard (`news`)."""

    stages: list[Stage]
    handoffs: Handoffs | None
    records: dict[int, FleetRecord] = field(default_factory=dict)
    queue: list[tuple[float, int, str, int, int]] = field(default_factory=list)  # (t, order, what, worker, rid)
    news: list[tuple[float, int, int, int, str, Any]] = field(default_factory=list)  # (t, order, stage, worker, ...)
    order: int = 0
    decode_requests: dict[int, TraceRequest] = field(default_factory=dict)
    progress: Callable[[int, int], None] | None = None  # (requests done, all), as they finish
    done: int = 0

    def push(self, t: float, what: str, worker: int, rid: int) -> None:
        """A decode-stage entry: "route" `rid` at `t`, or "deliver" it to `worker`."""
        heapq.heappush(self.queue, (t, self.order, what, worker, rid))
        self.order += 1

    def tell(self, t: float, s: int, w: int, kind: str, payload: Any) -> None:
        """News from replica (s, w) at time `t` for its router: "events", "prefilled", "finished"."""
        heapq.heappush(self.news, (t, self.order, s, w, kind, payload))
        self.order += 1

    def hear(self, until: float) -> None:
        """The routers hear every piece of news up to `until`, in time order."""
        news = self.news
        while news and news[0][0] <= until:
            t, _, s, w, kind, payload = heapq.heappop(news)
            router = self.stages[s].router
            if kind == "events":
                router.observe(w, payload, t)
            elif kind == "prefilled":
                router.prefilled(payload, t)
            else:
                router.finished(payload, t)

    def advance(self, s: int, until: float) -> None:
        """Run every replica of stage `s` with work to `until`, collect what each did."""
        for w, replica in enumerate(self.stages[s].replicas):
            t = replica.next_event_s()
            if t is not None and t < until:
                replica.run_until(until)
                finished = harvest(self, s, w)
                if finished and self.progress is not None:
                    self.done += finished
                    self.progress(self.done, len(self.records))


def run_fleet(
    trace: Trace,
    stages: Sequence[Stage],
    *,
    max_seq_len: int,
    handoffs: Handoffs | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[FleetRecord], list[ReplicaSummary]]:
    """Replay `trace` (arrival times set) on the fleet: `stages` is one
    aggregated stage, or a prefill and a decode stage with `handoffs`.
    Returns every request's record (trace order) and every replica's summary
    (stage order). A prompt of `max_seq_len` tokens or more is rejected
    unrouted (the replicas would reject it). `progress(done, total)` is
    called as requests finish."""
    if (len(stages) == 2) != (handoffs is not None) or len(stages) not in (1, 2):
        raise ValueError("a fleet is one aggregated stage, or a prefill and a decode stage with handoffs")
    fleet = Fleet(list(stages), handoffs, progress=progress)
    n = len(trace)
    arrivals = admit(fleet, trace, max_seq_len)
    fleet.done, nxt = n - len(arrivals), 0
    if len(stages) == 1 and not stages[0].router.reads_workers:
        # a router that reads nothing of the replicas (round-robin) routes every
        # request up front; each replica then runs alone, its fast-forward uncut
        for t, request in arrivals:
            submit(fleet, 0, -1, request, t)
        nxt = len(arrivals)
    replay(fleet, arrivals, nxt)
    return [fleet.records[i] for i in range(n)], summaries(fleet)


def admit(fleet: Fleet, trace: Trace, max_seq_len: int) -> list[tuple[float, TraceRequest]]:
    """Every request's record in `fleet.records`; a prompt of `max_seq_len`
    tokens or more rejected there. Returns the others' (arrival, request), in
    trace order, each cut to its prompt (one output token) when the fleet is
    disaggregated."""
    n = len(trace)
    times = trace.arrival_s.tolist() if trace.arrival_s is not None else [0.0] * n
    arrivals: list[tuple[float, TraceRequest]] = []
    for i in range(n):
        request = TraceRequest.of(trace, i)
        rec = FleetRecord(i, times[i], request.prompt_len, min(request.output_len, max_seq_len - request.prompt_len))
        fleet.records[i] = rec
        if request.prompt_len >= max_seq_len:
            rec.rejected = rec.too_long = True
        else:
            arrivals.append((times[i], dataclasses.replace(request, output_len=1) if fleet.handoffs else request))
    return arrivals


def replay(fleet: Fleet, arrivals: list[tuple[float, TraceRequest]], nxt: int) -> None:
    """Run the fleet from `arrivals[nxt]` on: each replica up to the next
    arrival or queued handoff, the news heard, then that event applied, until
    nothing is left."""
    inf = math.inf
    while True:
        t0 = arrivals[nxt][0] if nxt < len(arrivals) else inf
        fleet.advance(0, t0)
        t = min(t0, fleet.queue[0][0]) if fleet.queue else t0
        if len(fleet.stages) == 2:
            fleet.advance(1, t)
        if t == inf:
            break
        fleet.hear(t)
        if fleet.queue and fleet.queue[0][0] == t:
            _, _, what, w, rid = heapq.heappop(fleet.queue)
            if what == "route":
                hand_off(fleet, rid, t)
            else:
                submit(fleet, 1, w, fleet.decode_requests.pop(rid), t)
        else:
            submit(fleet, 0, -1, arrivals[nxt][1], t)
            nxt += 1


def submit(fleet: Fleet, s: int, w: int, request: TraceRequest, t: float) -> None:
    """Route `request` in stage `s` at time `t` (unless already routed to `w`) and hand it to its replica."""
    stage = fleet.stages[s]
    if w < 0:
        w = stage.router.route(RouteRequest(request.rid, request.prompt_ids()), t)
    stage.replicas[w].submit(request, t)
    stage.inflight[w][request.rid] = request
    stage.unprefilled[w].add(request.rid)
    stage.requests[w] += 1
    stage.prompt_tokens[w] += request.prompt_len
    rec = fleet.records[request.rid]
    if stage.role == "prefill":
        rec.prefill_worker = w
    else:
        rec.worker = w


def harvest(fleet: Fleet, s: int, w: int) -> int:
    """What replica (s, w) did in its last run: its events, first tokens,
    finishes and rejections as news for its router, the records filled in
    (a finished prefill handed off). Returns the requests the fleet finished or rejected."""
    stage = fleet.stages[s]
    replica, unprefilled = stage.replicas[w], stage.unprefilled[w]
    clock = replica.clock_s()
    events = replica.drain_events()
    if events:
        fleet.tell(clock, s, w, "events", events)
    if unprefilled:
        for rid, t in replica.first_tokens(unprefilled):
            unprefilled.discard(rid)
            fleet.tell(t, s, w, "prefilled", rid)
    return record_rejections(fleet, s, w, clock) + record_finishes(fleet, s, w)


def record_rejections(fleet: Fleet, s: int, w: int, clock: float) -> int:
    """Replica (s, w)'s rejections told its router as finished and recorded; returns how many."""
    stage = fleet.stages[s]
    inflight, unprefilled = stage.inflight[w], stage.unprefilled[w]
    rejected = 0
    for rid in stage.replicas[w].take_rejected():
        del inflight[rid]
        unprefilled.discard(rid)
        fleet.tell(clock, s, w, "finished", rid)
        fleet.records[rid].rejected = True
        rejected += 1
    return rejected


def record_finishes(fleet: Fleet, s: int, w: int) -> int:
    """Replica (s, w)'s finishes told its router and recorded, a finished
    prefill queued for the decode stage. Returns the requests the fleet finished."""
    stage = fleet.stages[s]
    inflight, unprefilled = stage.inflight[w], stage.unprefilled[w]
    finished = 0
    for done in stage.replicas[w].take_finished():
        request = inflight.pop(done.rid)
        if done.rid in unprefilled:
            unprefilled.discard(done.rid)
            fleet.tell(done.first_token_s, s, w, "prefilled", done.rid)
        fleet.tell(done.finish_s, s, w, "finished", done.rid)
        rec = fleet.records[done.rid]
        if stage.role == "prefill" and rec.output_len > 1:
            fleet.decode_requests[done.rid] = request
            fleet.push(done.finish_s, "route", -1, done.rid)  # the decode stage routes it when its prompt is done
            continue
        if rec.first_token_s is None:
            rec.first_token_s = done.first_token_s
        rec.finish_s = done.finish_s
        if stage.role != "prefill":
            rec.output_len = done.output_len
        finished += 1
    return finished


def hand_off(fleet: Fleet, rid: int, now: float) -> None:
    """`rid`'s prompt was computed (its first token sampled) on a prefill
    replica at `now`: the decode stage's router picks its decode replica now,
    and it is delivered there once its pages crossed the link. On the decode
    replica it continues at its prompt (whose compute the decode step model
    does not charge: `fleet.steps.DecodeSteps`), its first token being the
    decode replica's first."""
    handoffs = fleet.handoffs
    assert handoffs is not None
    rec = fleet.records[rid]
    request = dataclasses.replace(fleet.decode_requests[rid], output_len=rec.output_len)
    transfer = handoffs.transfer(request.prompt_len)
    rec.transfer_s = transfer.seconds
    w = fleet.stages[1].router.route(RouteRequest(rid, request.prompt_ids()), now)
    end = now + transfer.seconds
    handoffs.in_flight.setdefault(w, []).append((now, end, transfer.pages))
    fleet.decode_requests[rid] = request
    fleet.push(end, "deliver", w, rid)


def summaries(fleet: Fleet) -> list[ReplicaSummary]:
    out = []
    for stage in fleet.stages:
        for w, rep in enumerate(stage.replicas):
            peak = fleet.handoffs.peak_pages(w) if fleet.handoffs is not None and stage.role == "decode" else {}
            out.append(ReplicaSummary(w, stage.role, stage.requests[w], stage.prompt_tokens[w], rep.result(), peak))
    return out
