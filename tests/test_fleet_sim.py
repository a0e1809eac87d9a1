"""The fleet on kvpool's own replicas (`kvpool.sim.Replica` through
`fleet.replicas`): a fleet of one is `simulate`; round-robin replicas are
independent simulations of their shares of the trace; the kv router buys
prefix hits round-robin leaves; a handoff's TTFT is the prefill, the transfer
and one decode step; an SLO search on 2 local Ray workers equals the serial search."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_helpers import shared_traces, small_plan
from kvpool.fleet import make_router
from kvpool.fleet.loop import Handoffs, Stage, Transfer, run_fleet
from kvpool.fleet.metrics import FleetResult
from kvpool.fleet.replicas import make_replica
from kvpool.plan import PoolPlan
from kvpool.sim import StepTimeModel, Weights, simulate
from kvpool.sim.serial_or_ray import ray_available
from kvpool.trace import Trace
from sim_helpers import toy_gpu


def model_of(plan: PoolPlan) -> StepTimeModel:
    return StepTimeModel.build(plan.spec, toy_gpu(), Weights(1e9, 1e9, 2.0), "roofline")


def fleet(
    plan: PoolPlan, trace: Trace, n: int, router: str, *, events: bool = True, block_size: int = 0
) -> FleetResult:
    model = model_of(plan)
    reps = [make_replica(plan, model, "aggregated", str(i), events=events, reuse=True) for i in range(n)]
    stage = Stage("aggregated", reps, make_router(router, n, **({"block_size": block_size} if block_size else {})))
    records, summaries = run_fleet(trace, [stage], max_seq_len=plan.limits.max_seq_len)
    return FleetResult(router, tuple(records), tuple(summaries), n)


def share(trace: Trace, take: list[int]) -> Trace:
    assert trace.arrival_s is not None and trace.hash_ids is not None
    return Trace(
        "share",
        trace.prompt_len[take],
        trace.output_len[take],
        trace.arrival_s[take],
        tuple(trace.hash_ids[i] for i in take),
        trace.hash_block_tokens,
    )


@settings(max_examples=25, deadline=None)
@given(
    trace=shared_traces(),
    pages=st.integers(14, 60),
    router=st.sampled_from(["round-robin", "least-load", "prefix", "kv"]),
)
def test_a_fleet_of_one_is_simulate(trace: Trace, pages: int, router: str) -> None:
    plan = small_plan(pages)
    result = fleet(plan, trace, 1, router, block_size=4 if router in ("kv", "prefix") else 0)
    whole = simulate(plan, trace, model_of(plan), reuse=True)
    served = sorted(r.ttft for r in result.records if r.done)
    assert np.array_equal(np.array(served), np.sort(whole.ttft_s))
    assert result.finished == whole.finished and result.rejected == whole.rejected
    assert result.prompt_hit_rate == whole.prompt_hit_rate
    assert result.replicas[0].result.steps == whole.steps


@settings(max_examples=20, deadline=None)
@given(trace=shared_traces(), pages=st.integers(14, 60), n=st.integers(2, 3))
def test_round_robin_replicas_are_simulations_of_their_shares(trace: Trace, pages: int, n: int) -> None:
    """Round-robin routes without looking: replica k serves requests k, k+n,
    ... exactly as a simulation of those alone would."""
    plan = small_plan(pages)
    result = fleet(plan, trace, n, "round-robin", events=False)
    for k in range(n):
        take = list(range(k, len(trace), n))
        alone = simulate(plan, share(trace, take), model_of(plan), reuse=True)
        mine = sorted(r.ttft for r in result.records if r.done and r.worker == k)
        assert np.allclose(mine, np.sort(alone.ttft_s), rtol=0, atol=1e-12)
        assert result.replicas[k].result.prompt_hit_rate == alone.prompt_hit_rate


def conversations(n_conv: int, turns: int, gap: float) -> Trace:
    """Multi-turn chat: every conversation's turn t repeats its previous turns
    (4-token blocks) and adds two blocks; conversations interleave in time."""
    rows, times = [], []
    for t in range(turns):
        for c in range(n_conv):
            rows.append(tuple(1000 * c + b for b in range(2 * t + 2)))
            times.append(gap * (t * n_conv + c))
    prompt = np.array([4 * len(r) for r in rows], dtype=np.int64)
    return Trace("chat", prompt, np.full(len(rows), 3, dtype=np.int64), np.array(times), tuple(rows), 4)


def test_the_kv_router_keeps_conversations_on_their_replica() -> None:
    plan = small_plan(200)
    trace = conversations(4, 5, 0.05)
    kv = fleet(plan, trace, 3, "kv", block_size=4)
    rr = fleet(plan, trace, 3, "round-robin")
    blocks = sum(len(h) - 2 for h in trace.hash_ids or ())  # every turn after the first finds its history
    assert kv.prompt_hit_rate == pytest.approx(4 * blocks / int(trace.prompt_len.sum()))
    assert rr.prompt_hit_rate < kv.prompt_hit_rate
    for c in range(4):
        assert len({r.worker for r in kv.records if r.rid % 4 == c}) == 1


def test_events_that_arrive_too_late_cost_the_kv_router_its_hits() -> None:
    """Six conversations whose turns overlap on three busy replicas: with
    events 10 s late the router has never heard where a conversation's pages
    are when its next turn comes, and balances load instead (an idle fleet
    would tie every worker at the same cost and send all to worker 0)."""
    plan = small_plan(200)
    trace = conversations(6, 5, 0.002)
    model = model_of(plan)

    def hits(lag_s: float) -> float:
        reps = [make_replica(plan, model, "aggregated", str(i), events=True, reuse=True) for i in range(3)]
        stage = Stage("aggregated", reps, make_router("kv", 3, block_size=4, event_lag_s=lag_s))
        records, summaries = run_fleet(trace, [stage], max_seq_len=plan.limits.max_seq_len)
        return FleetResult("kv", tuple(records), tuple(summaries), 3).prompt_hit_rate

    assert hits(10.0) < hits(0.0)


def test_a_handoff_costs_the_prefill_the_transfer_and_one_decode_step() -> None:
    plan = small_plan(60)
    model = model_of(plan)
    trace = Trace("one", np.array([30]), np.array([5]), np.array([0.0]), ((1, 2, 3, 4, 5, 6, 7, 8),), 4)
    stages = [
        Stage(
            "prefill",
            [make_replica(plan, model, "prefill", "p", events=False, reuse=True)],
            make_router("kv", 1, block_size=4),
        ),
        Stage(
            "decode",
            [make_replica(plan, model, "decode", "d", events=False, reuse=True)],
            make_router("kv", 1, block_size=4),
        ),
    ]
    handoffs = Handoffs(lambda n: Transfer(0.125, {"full": math.ceil(n / 4)}))
    records, summaries = run_fleet(trace, stages, max_seq_len=plan.limits.max_seq_len, handoffs=handoffs)
    rec = records[0]
    prefill = model.time([], [(0, 30)])  # the whole prompt in one step (32 tokens a step)
    decode_row = model.time([(29, 0)], [])  # the first step on the decode side: one decode row at history 29
    assert rec.first_token_s == pytest.approx(prefill + 0.125 + decode_row, rel=1e-12)
    assert summaries[1].transfer_peak_pages == {"full": 8}
    # then decode-only steps, replayed as the CUDA graph of batch size 1
    rest = sum(model.time([(30 + k, 0)], [], graph=True, padded_batch=1) for k in range(4))
    assert rec.finish_s is not None and rec.first_token_s is not None
    assert rec.finish_s - rec.first_token_s == pytest.approx(rest, rel=1e-9)


@pytest.mark.slow  # starts a local Ray cluster and runs the search twice
@pytest.mark.skipif(not ray_available(), reason="Ray is not installed (kvpool[sweep])")
def test_an_slo_search_on_two_ray_workers_equals_the_serial_search() -> None:
    from kvpool.deploy.fleet_fit import fit_fleet

    kw = {"gpu": "h100", "trace": "azure-conv", "slo": "ttft_p99=300ms,itl_p99=40ms", "max_requests": 60}
    kw |= {"rate": 100.0, "max_gpus": 3, "tps": [1], "routers": ["kv", "round-robin"]}
    serial = fit_fleet("qwen3-8b", **kw)  # type: ignore[arg-type]
    ray = fit_fleet("qwen3-8b", workers=2, **kw)  # type: ignore[arg-type]
    assert "serially" in serial.notes[-1] and "Ray tasks" in ray.notes[-1] and "2 CPUs" in ray.notes[-1]
    assert json.dumps({**ray.to_dict(), "notes": []}) == json.dumps({**serial.to_dict(), "notes": []})
    best = serial.best
    assert best is not None and best.gpus > 1  # a search that went past one GPU, with P:D splits on the way
    assert all(not e.meets for e in serial.evaluations if e.gpus < best.gpus)
    assert any(e.layout.disaggregated for e in serial.evaluations)
