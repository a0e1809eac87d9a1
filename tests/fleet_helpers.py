"""Factories for the fleet tests: replicas whose cache is a real
`KVCacheManager` that serves a prompt at once (its pages cached when it
finishes), feeding a router its KV events as a fleet would."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from cache_helpers import full_spec
from kvpool.cache import KVCacheManager
from kvpool.cache.kv_wire import wire_events
from kvpool.fleet import Router, RouteRequest
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sim import RequestRecord, SimResult, TraceRequest
from kvpool.trace import Trace

TPB = 4


class Replica:
    """One worker: a manager of `pages` pages of `TPB` tokens (full attention)."""

    def __init__(self, pages: int = 64) -> None:
        plan = PoolPlan.from_pages(
            full_spec(tpb=TPB), {"full": pages}, ServingLimits(max_batch_size=8, max_seq_len=512)
        )
        self.m = KVCacheManager(plan)

    def serve(self, rid: int, prompt: Sequence[int]) -> int:
        """Compute `prompt` (its cached prefix reused) and finish; returns the tokens reused."""
        hit = self.m.cached_prefix(prompt).gpu
        self.m.create(rid, list(prompt))
        assert self.m.resize(rid, len(prompt), len(prompt))
        self.m.commit(rid, len(prompt))
        self.m.free(rid)
        return hit

    def events(self) -> list[object]:
        return list(wire_events(self.m.take_events(), self.m.groups))


def serve_through(router: Router, replicas: list[Replica], prompts: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Route each prompt, serve it on the chosen replica at once, hand the
    router that replica's events; the choices and the prompt tokens reused."""
    choices, reused = [], 0
    for rid, prompt in enumerate(prompts):
        w = router.route(RouteRequest(rid, prompt), float(rid))
        reused += replicas[w].serve(rid, prompt)
        router.prefilled(rid, float(rid))
        router.finished(rid, float(rid))
        router.observe(w, replicas[w].events(), float(rid))
        choices.append(w)
    return choices, reused


class FakeReplica:
    """A steppable replica with the interface of `kvpool.fleet.loop.FleetReplica`,
    for the fleet loop's tests: steps of `step_s` seconds; each step admits
    waiting requests up to `batch` running, computes an admitted prompt in one
    step (its cached prefix, in a real `KVCacheManager` of `pages` pages, free)
    and gives every running request one token; a prompt longer than the pool
    is rejected. Its cache's events go out as vLLM events. `submitted` logs
    (time, rid), `ran_to` every `run_until` time."""

    def __init__(self, step_s: float = 0.01, batch: int = 4, pages: int = 64) -> None:
        plan = PoolPlan.from_pages(
            full_spec(tpb=TPB), {"full": pages}, ServingLimits(max_batch_size=batch, max_seq_len=512)
        )
        self.plan, self.m, self.step_s, self.batch = plan, KVCacheManager(plan), step_s, batch
        self.clock = 0.0
        self.waiting: list[tuple[TraceRequest, float]] = []
        self.running: dict[int, tuple[TraceRequest, float, int, int, float | None]] = {}
        self.finished: list[RequestRecord] = []
        self.records: list[RequestRecord] = []  # every finished request's, kept for `result`
        self.rejected: list[int] = []
        self.submitted: list[tuple[float, int]] = []
        self.ran_to: list[float] = []
        self.prompt_tokens = self.prompt_hits = self.steps = 0

    def submit(self, request: TraceRequest, arrival_s: float) -> None:
        assert not self.submitted or arrival_s >= self.submitted[-1][0]
        self.submitted.append((arrival_s, request.rid))
        self.waiting.append((request, arrival_s))

    def next_event_s(self) -> float | None:
        """The clock while busy; an idle replica's next arrival (it waits for it)."""
        if self.running or (self.waiting and self.waiting[0][1] <= self.clock):
            return self.clock
        return self.waiting[0][1] if self.waiting else None

    def run_until(self, t_s: float) -> None:
        assert not self.ran_to or t_s >= self.ran_to[-1]
        self.ran_to.append(t_s)
        while (nxt := self.next_event_s()) is not None and nxt < t_s:
            self.clock = nxt
            self.step()

    def step(self) -> None:
        end = self.clock + self.step_s
        while self.waiting and self.waiting[0][1] <= self.clock and len(self.running) < self.batch:
            request, arrival = self.waiting.pop(0)
            prompt = request.prompt_ids()
            if -(-len(prompt) // TPB) > self.m.free_pages("full"):
                self.rejected.append(request.rid)
                continue
            hit = self.m.create(request.rid, prompt)
            assert self.m.resize(request.rid, len(prompt), len(prompt))
            self.m.commit(request.rid, len(prompt))
            self.prompt_tokens += len(prompt)
            self.prompt_hits += hit
            self.running[request.rid] = (request, arrival, hit, 0, None)
        for rid, (request, arrival, hit, out, first) in list(self.running.items()):
            out, first = out + 1, end if first is None else first
            self.running[rid] = (request, arrival, hit, out, first)
            if out >= request.output_len:
                del self.running[rid]
                self.m.free(rid)
                self.finished.append(RequestRecord(rid, arrival, first, end, request.prompt_len, out, hit, 0))
                self.records.append(self.finished[-1])
        self.steps += 1
        self.clock = end

    def drain_events(self) -> list[object]:
        return list(wire_events(self.m.take_events(), self.m.groups))

    def take_finished(self) -> list[RequestRecord]:
        out, self.finished = self.finished, []
        return out

    def take_rejected(self) -> list[int]:
        out, self.rejected = self.rejected, []
        return out

    def first_tokens(self, rids: set[int]) -> list[tuple[int, float]]:
        return [(rid, r[4]) for rid, r in self.running.items() if rid in rids and r[4] is not None]

    def clock_s(self) -> float:
        return self.clock

    def result(self) -> SimResult:
        return SimResult(
            policy="fake",
            plan=self.plan,
            num_requests=len(self.submitted),
            finished=0,
            rejected=0,
            output_tokens=0,
            makespan_s=self.clock,
            ttft_s=np.zeros(0),
            tpot_s=np.zeros(0),
            preemptions=0,
            steps=self.steps,
            decode_steps=0,
            decode_only_steps=0,
            graph_steps=0,
            padding_failures=0,
            pages={},
            prompt_hit_rate=self.prompt_hits / self.prompt_tokens if self.prompt_tokens else 0.0,
            requests=tuple(self.records),
        )


def small_plan(pages: int) -> PoolPlan:
    """A full-attention replica of `pages` pages of 4 tokens, 4 requests and 32 tokens a step, L = 128."""
    return PoolPlan.from_pages(
        full_spec(tpb=TPB), {"full": pages}, ServingLimits(max_batch_size=4, max_seq_len=128, max_num_tokens=32)
    )


@st.composite
def shared_traces(draw: st.DrawFn) -> Trace:
    """1-14 requests whose prompts (4-token blocks) start with a prefix of one
    of 1-3 conversations, outputs of 1-40 tokens, a few steps apart."""
    convs = draw(st.lists(st.lists(st.integers(0, 300), min_size=2, max_size=10), min_size=1, max_size=3))
    n = draw(st.integers(1, 14))
    rows = [tuple(draw(st.sampled_from(convs))[: draw(st.integers(1, 10))]) for _ in range(n)]
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.004, 0.02]), min_size=n, max_size=n))
    return Trace(
        "shared",
        np.array([max(1, TPB * len(r) - draw(st.integers(0, TPB - 1))) for r in rows], dtype=np.int64),
        np.array([draw(st.integers(1, 40)) for _ in rows], dtype=np.int64),
        np.cumsum(gaps),
        hash_ids=tuple(rows),
        hash_block_tokens=TPB,
    )
