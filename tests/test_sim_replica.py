"""A replica stepped by its caller: `simulate` is one replica fed the whole
trace, and however a caller slices time (as a fleet does, submitting each
request when its router sees it) the run is the same."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvpool.errors import KvpoolError
from kvpool.index import PrefixIndex
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sim import Replica, ReplicaSpec, SimResult, StepTimeModel, TraceRequest, Weights, simulate
from kvpool.trace import Trace
from sim_helpers import toy_gpu, toy_spec

GPU = toy_gpu()
WEIGHTS = Weights(1e9, 1e9, 2.0)


def toy_plan(pages: int, window: int | None = None) -> PoolPlan:
    spec = toy_spec(window=window)
    limits = ServingLimits(max_batch_size=4, max_seq_len=128, max_num_tokens=32)
    return PoolPlan.from_pages(spec, {g.name: pages for g in spec.groups}, limits)


def spec_of(plan: PoolPlan, **kw: object) -> ReplicaSpec:
    return ReplicaSpec(plan, StepTimeModel.build(plan.spec, GPU, WEIGHTS, "roofline"), reuse=True, **kw)  # type: ignore[arg-type]


@st.composite
def traces(draw: st.DrawFn, distinct: bool = False) -> Trace:
    """Requests from a few conversations sharing leading blocks (4 tokens each),
    arriving over a few steps' time; with `distinct`, each prompt ends in a
    block of its own (no prompt repeats another)."""
    n = draw(st.integers(1, 12))
    convs = draw(st.lists(st.lists(st.integers(0, 500), min_size=2, max_size=12), min_size=1, max_size=3))
    rows = [tuple(convs[draw(st.integers(0, len(convs) - 1))][: draw(st.integers(1, 12))]) for _ in range(n)]
    if distinct:
        rows = [(*row, 1000 + i) for i, row in enumerate(rows)]
    prompt = [max(1, 4 * len(b) - draw(st.integers(0, 3))) for b in rows]
    out = [draw(st.integers(1, 60)) for _ in rows]
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.01, 0.05]), min_size=n, max_size=n))
    return Trace(
        "t",
        np.array(prompt, dtype=np.int64),
        np.array(out, dtype=np.int64),
        np.cumsum(gaps),
        hash_ids=tuple(rows),
        hash_block_tokens=4,
    )


def assert_same_run(a: SimResult, b: SimResult, *, peaks: bool) -> None:
    """Every count and time equal; peaks too where pages only grow during a
    run (a run cut in two measures its peak where it is cut as well)."""
    assert np.array_equal(a.ttft_s, b.ttft_s) and np.array_equal(a.tpot_s, b.tpot_s)
    assert a.requests == b.requests
    fields: tuple[str, ...] = ("makespan_s", "steps", "decode_steps", "graph_steps", "preemptions", "finished")
    fields += ("rejected", "output_tokens", "reuse_hit_rate", "prompt_hit_rate", "end_used", "num_requests")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    if peaks:
        assert {g: u.peak_used for g, u in a.pages.items()} == {g: u.peak_used for g, u in b.pages.items()}


def stepped(spec: ReplicaSpec, trace: Trace, cuts: list[float]) -> SimResult:
    """A fleet's way: before each arrival the replica runs up to it (through
    the extra `cuts` on the way), then gets the request."""
    replica = Replica(spec)
    assert trace.arrival_s is not None
    arrivals = trace.arrival_s.tolist()
    times = sorted([(t, 1, -1) for t in cuts] + [(t, 0, i) for i, t in enumerate(arrivals)])
    for t, is_cut, i in times:
        replica.run_until(t)
        if not is_cut:
            replica.submit(TraceRequest.of(trace, i), t)
    replica.run_until(math.inf)
    assert replica.next_event_s() is None
    return replica.result()


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    fast=st.booleans(),
    pages=st.integers(14, 60),
    window=st.sampled_from([None, 8]),
    cuts=st.lists(st.floats(0.0, 0.4), max_size=30),
)
def test_a_replica_stepped_in_any_slices_equals_one_simulate(
    data: st.DataObject, fast: bool, pages: int, window: int | None, cuts: list[float]
) -> None:
    """Single steps and fast-forwarded runs on any traffic, prompts repeated
    verbatim included (a run ends where a repeat fills a page whose digest its
    twin's page holds: `sched.shared_fill_limit`)."""
    trace = data.draw(traces())
    spec = spec_of(toy_plan(pages, window), fast=fast)
    whole = simulate(spec.plan, trace, spec.model, reuse=True, check=True, fast=fast)
    assert_same_run(stepped(spec, trace, cuts), whole, peaks=window is None)


@settings(max_examples=30, deadline=None)
@given(trace=traces(), pages=st.integers(14, 60), step=st.floats(0.0005, 0.05))
def test_stepping_never_moves_an_idle_clock_past_the_horizon(trace: Trace, pages: int, step: float) -> None:
    """`next_event_s` says when the replica acts next; `run_until(t)` runs
    only steps that start before t."""
    replica = Replica(spec_of(toy_plan(pages)))
    assert replica.next_event_s() is None
    assert trace.arrival_s is not None
    for i, a in enumerate(trace.arrival_s.tolist()):
        replica.submit(TraceRequest.of(trace, i), a)
    t = 0.0
    while (nxt := replica.next_event_s()) is not None:
        before, clock = (replica.tally.steps, replica.rejected), replica.now
        t += step
        replica.run_until(t)
        if nxt >= t:  # nothing was due: nothing ran, the clock stayed
            assert ((replica.tally.steps, replica.rejected), replica.now) == (before, clock)
        else:  # an idle clock jumps to an arrival before t; a step (or a rejection) happens before t
            assert (replica.tally.steps, replica.rejected) > before
        load = replica.load()
        assert load.running <= 4 and 0.0 <= load.usage <= 1.0
    assert replica.result().finished + replica.result().rejected == len(trace)


def test_load_counts_what_waits_and_runs() -> None:
    """Three 16-token prompts at once, 32 tokens per step: the first step
    computes two prompts (4 pages each), the third waits."""
    plan = toy_plan(100)
    replica = Replica(spec_of(plan))
    for i in range(3):
        replica.submit(TraceRequest(i, 16, 5), 0.0)
    load = replica.load()
    assert (load.waiting, load.running, load.prefill_tokens) == (3, 0, 48)
    padding = replica.result().reserved["full"]  # warmup's padding dummy
    assert load.total_pages == {"full": 100} and load.free_pages == {"full": 100 - padding}
    replica.run_until(1e-9)  # the first step only
    load = replica.load()
    assert (load.waiting, load.running, load.prefill_tokens) == (1, 2, 16)
    assert load.total_pages["full"] - load.free_pages["full"] == padding + 2 * 16 // 4


def test_events_only_when_asked() -> None:
    """A replica with events hands over vLLM's BlockStored events for the
    pages it filled, which a router's index reads; without, none are kept."""
    plan = toy_plan(100)
    quiet, loud = Replica(spec_of(plan)), Replica(spec_of(plan), name="1", events=True)
    for r in (quiet, loud):
        r.submit(TraceRequest(0, 16, 3, (7, 8, 9, 10), 4), 0.0)
        r.run_until(math.inf)
    assert quiet.drain_events() == [] and not quiet.manager.events
    events = loud.drain_events()
    assert events and loud.drain_events() == []
    index = PrefixIndex(4)
    index.apply(loud.name, events)
    tokens = TraceRequest(0, 16, 3, (7, 8, 9, 10), 4).prompt_ids()
    assert index.query(tokens)[loud.name].gpu == 16  # its 4 computed pages, stored (and freed, still cached)
    assert quiet.result().requests == loud.result().requests


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 2**40), max_size=12),
    st.sampled_from([1, 4, 512]),
    st.integers(1, 7000),
)
def test_prompt_ids_are_the_blocks_ids(hash_ids: list[int], block: int, prompt_len: int) -> None:
    # the module's rule: block id b covers tokens b * B .. b * B + B - 1, so position p holds
    # hash_ids[p // B] * B + p % B (a prompt longer than its blocks stops where they do)
    want = [hash_ids[p // block] * block + p % block for p in range(min(prompt_len, len(hash_ids) * block))]
    request = TraceRequest(3, prompt_len, 1, tuple(hash_ids), block)
    assert request.prompt_ids() == want
    assert request.prompt_array().typecode == "q" and request.prompt_array().tolist() == want


def test_records_per_request() -> None:
    replica = Replica(spec_of(toy_plan(100)))
    replica.submit(TraceRequest(5, 8, 4), 0.25)
    replica.run_until(math.inf)
    (rec,) = replica.result().requests
    assert rec.rid == 5 and rec.arrival_s == 0.25 and rec.output_len == 4 and rec.prompt_len == 8
    assert rec.ttft_s > 0 and rec.e2e_s > rec.ttft_s and rec.itl_s == pytest.approx((rec.e2e_s - rec.ttft_s) / 3)
    assert replica.result().ttft_s.tolist() == [rec.ttft_s]


def test_cold_tiers_need_the_replicas_own_session() -> None:
    with pytest.raises(KvpoolError, match="need a link"):
        spec_of(toy_plan(20), preemption="suspend")


def repeats(prompt: list[int], out: list[int], hash_ids: tuple[tuple[int, ...], ...]) -> Trace:
    """Requests arriving at once, whose prompts repeat block 0 (4 tokens)."""
    n = len(prompt)
    return Trace("t", np.array(prompt), np.array(out), np.zeros(n), hash_ids=hash_ids, hash_block_tokens=4)


@settings(max_examples=60, deadline=None)
@given(trace=traces(), pages=st.integers(14, 40), batch=st.sampled_from([2, 4]))
# found by hypothesis: a repeat's run evicted its finished twin's page before storing its own; a run's last
# step stored a finished row's page before the page of its twin that goes on; `adopt` walked back further
@example(repeats([4] * 5 + [8] + [4] * 3, [1, 1, 13, 23, 11, 1, 1, 1, 1], ((0,),) * 5 + ((0, 0),) + ((0,),) * 3), 14, 2)
@example(repeats([4, 8, 8] + [4] * 6, [9, 9, 30, 1, 1, 14, 14, 1, 1], ((0,), (0, 0), (0, 0)) + ((0,),) * 6), 14, 2)
def test_fast_forward_equals_single_steps(trace: Trace, pages: int, batch: int) -> None:
    """Runs of decode steps, those a waiting request waits through included
    (its pages short, or the batch full), end where single steps end: the
    same admissions, preemptions, hits and pages; the same times but for the
    rounding of the vectorised step times (`decode_run_times`). Prompts
    repeated verbatim too: their decode pages (every output is the same
    token) have the digests of a twin's, and a run ends where one fills
    such a page (`sched.shared_fill_limit`), so that it offers it after the
    evictions single steps make before it, not after later ones."""
    spec = toy_spec()
    limits = ServingLimits(max_batch_size=batch, max_seq_len=128, max_num_tokens=32)
    plan = PoolPlan.from_pages(spec, {"full": pages}, limits)
    model = spec_of(plan).model
    fast = simulate(plan, trace, model, reuse=True, check=True)
    slow = simulate(plan, trace, model, reuse=True, check=True, fast=False)
    counts: tuple[str, ...] = (
        "steps",
        "decode_steps",
        "graph_steps",
        "preemptions",
        "finished",
        "rejected",
        "output_tokens",
    )
    counts += ("reuse_hit_rate", "prompt_hit_rate", "end_used")
    assert [getattr(fast, f) for f in counts] == [getattr(slow, f) for f in counts]
    assert [(r.rid, r.cached_tokens, r.preemptions) for r in fast.requests] == [
        (r.rid, r.cached_tokens, r.preemptions) for r in slow.requests
    ]
    assert fast.ttft_s == pytest.approx(slow.ttft_s, rel=1e-9) and fast.makespan_s == pytest.approx(slow.makespan_s)
    for g, u in fast.pages.items():
        assert u.peak_used == slow.pages[g].peak_used
        assert u.mean_used == pytest.approx(slow.pages[g].mean_used, rel=1e-9)  # summed step by step, not trapezoid
