"""The fleet's event loop (`kvpool.fleet.loop`) on fake steppable replicas
(`fleet_helpers.FakeReplica`): time order, routing at arrival, the routers'
bookkeeping, handoffs and the decode side's transfer headroom; and the fleet's
metrics (`kvpool.fleet.metrics`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_helpers import TPB, FakeReplica
from kvpool.fleet import make_router
from kvpool.fleet.loop import Handoffs, Stage, Transfer, run_fleet
from kvpool.fleet.metrics import FleetRecord, FleetResult, Slo, SloError
from kvpool.trace import Trace


def trace_of(
    prompts: list[int], outputs: list[int], times: list[float], hashes: list[tuple[int, ...]] | None = None
) -> Trace:
    """A trace; without `hashes` every prompt its own blocks (nothing shared)."""
    if hashes is None:
        hashes = [tuple(range(100 * i, 100 * i + 4)) for i in range(len(prompts))]
    return Trace(
        "t",
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        np.array(times, dtype=np.float64),
        tuple(hashes),
        hash_block_tokens=TPB * 4,
    )


def run(trace: Trace, n: int, router: str = "round-robin", **kw: Any) -> tuple[list[FakeReplica], FleetResult]:
    reps = [FakeReplica(**kw) for _ in range(n)]
    stage = Stage("aggregated", reps, make_router(router, n, **({"block_size": TPB} if router == "kv" else {})))
    records, summaries = run_fleet(trace, [stage], max_seq_len=512)
    return reps, FleetResult("test", tuple(records), tuple(summaries), n)


def test_round_robin_takes_replicas_in_turn_and_every_request_finishes() -> None:
    trace = trace_of([8] * 7, [3] * 7, [0.0, 0.001, 0.002, 0.5, 0.5, 0.6, 2.0])
    reps, result = run(trace, 3)
    assert [rid for r in reps for _, rid in r.submitted] == [0, 3, 6, 1, 4, 2, 5]
    assert [r.worker for r in result.records] == [0, 1, 2, 0, 1, 2, 0]
    assert result.finished == 7 and result.rejected == 0
    # alone on its replica: first token one step after arrival's step start, then a token a step
    first = result.records[6]
    assert first.ttft == pytest.approx(0.01) and first.itl == pytest.approx(0.01)
    assert result.imbalance() == pytest.approx(3 * 24 / 56)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 6), st.floats(0, 0.2)), min_size=1, max_size=30),
    st.integers(1, 4),
    st.sampled_from(["round-robin", "least-load", "prefix", "kv"]),
)
def test_time_moves_forward_and_requests_arrive_in_order(
    rows: list[tuple[int, int, float]], n: int, router: str
) -> None:
    rows.sort(key=lambda r: r[2])
    trace = trace_of([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    reps, result = run(trace, n, router)
    for r in reps:  # the fake asserts each replica's submits and run_until times never go back
        assert [t for t, _ in r.submitted] == sorted(t for t, _ in r.submitted)
    assert result.finished == len(rows)
    for rec in result.records:
        assert rec.first_token_s is not None and rec.finish_s is not None
        assert rec.arrival_s <= rec.first_token_s <= rec.finish_s
        assert rec.finish_s - rec.first_token_s == pytest.approx(0.01 * (rec.output_len - 1), abs=1e-9)


def test_least_load_sees_finishes_and_kv_routes_shared_prefixes_together() -> None:
    shared = [(1, 2, 3), (1, 2, 3), (4, 5), (1, 2, 3), (4, 5), (1, 2, 3)]
    times = [0.1 * i for i in range(len(shared))]
    trace = trace_of([48, 48, 32, 48, 32, 48], [2] * 6, times, shared)
    _, kv = run(trace, 2, "kv")
    _, rr = run(trace, 2, "round-robin")
    assert len({r.worker for r, h in zip(kv.records, shared, strict=True) if h[0] == 1}) == 1
    assert kv.prompt_hit_rate > rr.prompt_hit_rate
    # each request is done before the next arrives: least-load always finds worker 0 free
    _, ll = run(trace, 2, "least-load")
    assert [r.worker for r in ll.records] == [0] * 6


def test_a_prompt_that_never_fits_is_rejected_and_the_rest_finish() -> None:
    trace = trace_of([8, 400, 8], [2, 2, 2], [0.0, 0.0, 0.0])
    _, result = run(trace, 1, pages=16)
    assert [r.rejected for r in result.records] == [False, True, False]
    assert result.finished == 2
    assert result.misses(Slo.parse("ttft_p99=1s")) == ["1 requests rejected (more pages than a replica holds)"]
    _, over = run(trace_of([600, 8], [2, 2], [0.0, 0.0]), 1)  # past max_seq_len: never routed, not a miss
    assert over.rejected == over.too_long == 1 and over.replicas[0].requests == 1
    assert over.meets(Slo.parse("ttft_p99=1s"))


def disaggregated(
    trace: Trace, p: int, d: int, seconds: float, pages: int = 3
) -> tuple[list[FakeReplica], list[FakeReplica], FleetResult]:
    pre, dec = [FakeReplica() for _ in range(p)], [FakeReplica() for _ in range(d)]
    handoffs = Handoffs(lambda n: Transfer(seconds, {"full": pages}))
    stages = [Stage("prefill", pre, make_router("round-robin", p)), Stage("decode", dec, make_router("least-load", d))]
    records, summaries = run_fleet(trace, stages, max_seq_len=512, handoffs=handoffs)
    return pre, dec, FleetResult("pd", tuple(records), tuple(summaries), p + d)


def test_a_handoff_adds_its_transfer_and_a_decode_step_to_ttft() -> None:
    trace = trace_of([8, 8, 8], [4, 1, 4], [0.0, 1.0, 2.0])
    pre, dec, result = disaggregated(trace, 1, 1, seconds=0.25)
    a, one, b = result.records
    # prefill step (0.01), transfer (0.25), the decode side's first step (0.01)
    assert a.ttft == pytest.approx(0.27) and a.transfer_s == 0.25 and a.prefill_worker == 0 and a.worker == 0
    assert a.itl == pytest.approx(0.01)
    assert one.ttft == pytest.approx(0.01) and one.worker == -1  # one token: done on the prefill side
    assert [rid for _, rid in dec[0].submitted] == [0, 2] and dec[0].submitted[0][0] == pytest.approx(0.26)
    assert result.replicas[1].transfer_peak_pages == {"full": 3}
    assert result.prompt_hit_rate == 0.0 and set(result.to_dict()["imbalance"]) == {"decode", "prefill"}


def test_the_decode_side_headroom_is_the_most_pages_in_flight_at_once() -> None:
    trace = trace_of([8] * 4, [3] * 4, [0.0, 0.0, 0.0, 5.0])
    *_, result = disaggregated(trace, 1, 1, seconds=1.0, pages=5)
    assert result.replicas[1].transfer_peak_pages == {"full": 15}  # three transfers overlap, the fourth alone


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3), st.integers(0, 9)), max_size=12))
def test_peak_pages_is_the_most_at_any_instant(spans: list[tuple[float, float, int]]) -> None:
    h = Handoffs(lambda n: Transfer(0.0, {}))
    h.in_flight[0] = [(s, s + d, {"g": p}) for s, d, p in spans]
    points = [s for s, _, _ in spans]
    brute = max((sum(p for s, d, p in spans if s <= t < s + d) for t in points), default=0)
    assert h.peak_pages(0).get("g", 0) == brute


def test_slo_parsing_and_goodput() -> None:
    slo = Slo.parse("ttft_p99=2s, itl_p99=50ms,e2e_max=1min")
    assert slo.limit("ttft") == 2 and slo.limit("itl") == 0.05 and slo.limit("e2e") == 60
    assert str(Slo.parse(str(slo))) == str(slo)
    assert Slo.parse("e2e_p50=250us").limit("e2e") == 250e-6 and Slo.parse("ttft_p90=1.5").limit("ttft") == 1.5
    assert Slo.parse("itl_p99=50ms").limit("ttft") == math.inf
    for bad in ("ttft=2s", "tft_p99=2s", "ttft_p99", "ttft_p99=fast", "ttft_p99=-1s", "ttft_p99=1s,ttft_p99=2s"):
        with pytest.raises(SloError):
            Slo.parse(bad)
    fast = FleetRecord(0, 0.0, 10, 3, first_token_s=1.0, finish_s=1.08)
    slow_itl = FleetRecord(1, 0.0, 10, 3, first_token_s=1.0, finish_s=1.2)
    one = FleetRecord(2, 1.0, 10, 1, first_token_s=2.5, finish_s=2.5)
    result = FleetResult("x", (fast, slow_itl, one), (), 1, Slo.parse("ttft_p99=2s,itl_p99=50ms"))
    assert [r.meets(result.slo) for r in result.records] == [True, False, True]  # type: ignore[arg-type]
    assert result.good() == 2 and result.goodput() == pytest.approx(2 / 2.5)
    assert result.misses() == [f"itl_p99 {0.04 + 0.99 * (0.1 - 0.04):.3g} s > 0.05 s"] and not result.meets()
    assert result.latencies.at("ttft", 50) == 1.0


@pytest.mark.parametrize("router", ["round-robin", "least-load"])
def test_progress_counts_every_request_once(router: str) -> None:
    trace = trace_of([8, 8, 600, 8], [2, 3, 2, 4], [0.0, 0.1, 0.2, 0.3])
    seen: list[tuple[int, int]] = []
    stage = Stage("aggregated", [FakeReplica(), FakeReplica()], make_router(router, 2))
    run_fleet(trace, [stage], max_seq_len=512, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (4, 4) and [d for d, _ in seen] == sorted({d for d, _ in seen})
