"""A fleet's replicas: `kvpool.sim.Replica`s of one plan (a decode replica
with the decode side's step times, `fleet.steps.DecodeSteps`), and the three
questions the fleet's loop asks of each (`loop.FleetReplica`), answered from
the replica's own books (its tally's records, its scheduler's queues): a thin
adapter, no second simulator loop."""

from __future__ import annotations

from typing import Any

from kvpool.fleet.steps import DecodeSteps
from kvpool.plan import PoolPlan
from kvpool.sim import Replica, ReplicaSpec, RequestRecord, SimResult, StepTimeModel, TraceRequest


class StageReplica:
    """One `kvpool.sim.Replica` as the fleet's loop drives it (`loop.FleetReplica`).
    Not thread-safe; `take_*` consume what they return."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.taken = 0  # records of finished requests already returned
        self.rejected_seen = 0
        self.live: set[int] = set()  # submitted, neither finished nor rejected (as returned so far)

    def submit(self, request: TraceRequest, arrival_s: float) -> None:
        self.live.add(request.rid)
        self.replica.submit(request, arrival_s)

    def next_event_s(self) -> float | None:
        return self.replica.next_event_s()

    def run_until(self, t_s: float) -> None:
        self.replica.run_until(t_s)

    def drain_events(self) -> list[Any]:
        return self.replica.drain_events()

    def result(self) -> SimResult:
        return self.replica.result()

    def take_finished(self) -> list[RequestRecord]:
        """Records of the requests finished since the last call, in finishing order."""
        records = self.replica.tally.records
        new = records[self.taken :]
        self.taken = len(records)
        self.live.difference_update(r.rid for r in new)
        return new

    def take_rejected(self) -> list[int]:
        """Ids of the requests rejected since the last call: those submitted
        that are neither queued, running, suspended nor finished (the replica
        counts its rejections; only when the count moved is this asked)."""
        rep = self.replica
        if rep.rejected == self.rejected_seen:
            return []
        self.rejected_seen = rep.rejected
        sched = rep.sched
        present = {s.rid for s in (*sched.running, *sched.waiting, *sched.suspended)}
        present.update(r.rid for r, _ in rep.pending)
        present.update(r.rid for r in rep.tally.records[self.taken :])
        gone = sorted(self.live - present)
        self.live.difference_update(gone)
        return gone

    def first_tokens(self, rids: set[int]) -> list[tuple[int, float]]:
        """Which of `rids` have sampled their first token, and when (running
        ones; a finished one comes back from `take_finished`)."""
        return [
            (s.rid, s.first_token_s)
            for s in self.replica.sched.running
            if s.rid in rids and s.first_token_s is not None
        ]

    def clock_s(self) -> float:
        return self.replica.now


def make_replica(
    plan: PoolPlan,
    model: StepTimeModel,
    role: str,
    name: str,
    *,
    events: bool,
    reuse: bool,
    padding: bool = True,
    admission: str | None = None,
    hash_lookahead: int = 0,
) -> StageReplica:
    """One replica of `plan` in a stage of `role` ("aggregated", "prefill",
    "decode"), named `name`, emitting KV events when `events` (a kv router reads them)."""
    steps = DecodeSteps.of(model) if role == "decode" else model
    spec = ReplicaSpec(plan, steps, reuse=reuse, padding=padding, admission=admission, hash_lookahead=hash_lookahead)
    return StageReplica(Replica(spec, name=name, events=events))
