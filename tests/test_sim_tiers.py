"""Cold tiers in the simulator: the link arithmetic from the bandwidth figures,
a 0-byte host tier changes nothing, more host memory never lowers the hit
rate, and preemption by suspension brings every suspended page back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool import presets
from kvpool.cache import TierSpec
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sim import SimResult, StepTimeModel, Weights, simulate
from kvpool.sim.transfers import Link, Moved, PageMoves
from kvpool.spec import load_model_spec
from kvpool.trace import Trace
from sim_helpers import toy_gpu, toy_spec

GB = 1e9
# PCI-SIG: PCIe 5.0 runs 32 GT/s per lane, PCIe 4.0 16 GT/s, both with 128b/130b encoding.
PCIE5_X16 = 32e9 * 16 * 128 / 130 / 8
PCIE4_X4 = 16e9 * 4 * 128 / 130 / 8

GPU = toy_gpu(host_link="pcie5_x16", host_link_bytes_per_s=PCIE5_X16)
WEIGHTS = Weights(1e9, 1e9, 2.0)


def toy_plan(pages: int, tpb: int = 4, **limits: int) -> PoolPlan:
    limits.setdefault("max_batch_size", 4)
    limits.setdefault("max_seq_len", 128)
    limits.setdefault("max_num_tokens", 32)
    spec = toy_spec(tpb)
    return PoolPlan.from_pages(spec, {spec.groups[0].name: pages}, ServingLimits(**limits))  # type: ignore[arg-type]


def run(plan: PoolPlan, trace: Trace, host: int | None = None, **kw: object) -> SimResult:
    model = StepTimeModel.build(plan.spec, GPU, WEIGHTS, "roofline")
    tiers = () if host is None else (TierSpec(Medium.CPU, host),)
    link = Link.of(GPU) if tiers else None
    return simulate(plan, trace, model, check=True, tiers=tiers, link=link, **kw)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the link


def test_host_link_of_the_h100_preset_is_pcie5_x16() -> None:
    assert Link.of(presets.load_gpu("h100")).host_bytes_per_s == pytest.approx(PCIE5_X16, rel=1e-3)
    assert Link.of(GPU).disk_bytes_per_s == pytest.approx(PCIE4_X4)


def test_transfer_seconds_from_the_bandwidths() -> None:
    """Qwen3-8B's page of 16 positions: 36 layers x 8 KV heads x head_dim 128 x
    (K, V) x 2 bytes x 16 = 2,359,296 bytes (its config.json). 1,000 pages in
    over PCIe 5.0 x16 take 2.359 GB / 63.0 GB/s; out at the same time, the
    longer direction counts; from disk, the x4 drive is the slower link."""
    spec = load_model_spec("qwen3-8b", tokens_per_block=16)
    page = 36 * 8 * 128 * 2 * 2 * 16
    assert [g.slot_bytes for g in spec.groups] == [page]
    moves = PageMoves([page])
    for i in range(1000):
        moves.to_gpu(0, Medium.CPU, i, i)
    for i in range(400):
        moves.to_tier(0, i, Medium.CPU, i)
    moved = moves.take()
    link = Link(PCIE5_X16)
    inbound = 1000 * page / PCIE5_X16
    assert inbound == pytest.approx(0.03745, rel=1e-3)  # 2.359e9 B / 63.0e9 B/s
    assert link.transfer_seconds(moved) == pytest.approx(inbound)
    assert link.step_seconds(0.02, moved) == pytest.approx(0.02 + inbound)
    assert dataclasses.replace(link, overlap=True).step_seconds(0.02, moved) == pytest.approx(inbound)
    assert dataclasses.replace(link, overlap=True).step_seconds(0.05, moved) == pytest.approx(0.05)
    out_only = Moved(host_out=5000 * page)
    assert link.transfer_seconds(out_only) == pytest.approx(5000 * page / PCIE5_X16)
    disk = Moved(disk_in=100 * page)
    assert link.transfer_seconds(disk) == pytest.approx(100 * page / PCIE4_X4)
    spill = Moved(spilled=10**12)  # host -> disk does not use the GPU's link
    assert link.transfer_seconds(spill) == 0.0
    assert moves.take().empty and moves.pages_in["CPU"] == 1000 and moves.pages_out["CPU"] == 400


# ----------------------------------------------------------------------------- a 0-byte tier is no tier


def prefix_trace(data: st.DataObject) -> Trace:
    """Requests from a few conversations: each prompt is its conversation's
    first blocks (4 tokens each), so prompts share prefixes."""
    draw = data.draw
    n = draw(st.integers(2, 14))
    convs = draw(st.lists(st.lists(st.integers(0, 1000), min_size=2, max_size=16), min_size=1, max_size=3))
    rows = []
    for _ in range(n):
        blocks = convs[draw(st.integers(0, len(convs) - 1))]
        k = draw(st.integers(1, len(blocks)))
        rows.append(tuple(blocks[:k]))
    prompt = [4 * len(b) - draw(st.integers(0, 3)) for b in rows]
    out = [draw(st.integers(1, 40)) for _ in rows]
    gaps = draw(st.lists(st.floats(0, 0.002), min_size=n, max_size=n))
    return Trace(
        "t",
        np.array(prompt, dtype=np.int64),
        np.array(out, dtype=np.int64),
        np.cumsum(gaps) - gaps[0],
        hash_ids=tuple(rows),
        hash_block_tokens=4,
    )


def same_run(a: SimResult, b: SimResult) -> None:
    assert np.array_equal(a.ttft_s, b.ttft_s) and np.array_equal(a.tpot_s, b.tpot_s)
    assert (a.makespan_s, a.steps, a.preemptions, a.finished, a.rejected, a.output_tokens) == (
        b.makespan_s,
        b.steps,
        b.preemptions,
        b.finished,
        b.rejected,
        b.output_tokens,
    )
    assert (a.reuse_hit_rate, a.prompt_hit_rate, a.pages, a.end_used) == (
        b.reuse_hit_rate,
        b.prompt_hit_rate,
        b.pages,
        b.end_used,
    )


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_zero_byte_host_tier_equals_no_tier(data: st.DataObject) -> None:
    trace = prefix_trace(data)
    plan = toy_plan(data.draw(st.integers(20, 60)))
    preemption = data.draw(st.sampled_from(["recompute", "suspend"]))
    bare = run(plan, trace)
    tiered = run(plan, trace, host=0, preemption=preemption)
    same_run(bare, tiered)
    assert tiered.tiers is not None and tiered.tiers["pages_onboarded"] == tiered.tiers["pages_offloaded"] == 0
    assert tiered.tiers["transfer_s"] == 0.0


# ----------------------------------------------------------------------------- more host memory


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_more_host_memory_never_lowers_the_hit_rate(data: st.DataObject) -> None:
    """Conversations sharing prefixes through a GPU pool smaller than their
    pages, served one after another: a bigger host tier keeps what a smaller
    one keeps, and more (the GPU ends each request with its pages, computed
    or copied in, either way). Not for requests served together: a tier's hit
    leaves a step's token budget to a later request, admitted before the
    pages it would have hit are computed (`test_a_tier_can_move_a_hit`)."""
    trace = prefix_trace(data)
    trace = dataclasses.replace(trace, arrival_s=np.arange(len(trace), dtype=np.float64) * 10)  # each done first
    plan = toy_plan(data.draw(st.integers(12, 40)))
    page = plan.spec.groups[0].slot_bytes
    small, big = sorted(data.draw(st.lists(st.integers(0, 80), min_size=2, max_size=2)))
    assert run(plan, trace, host=small * page).prompt_hit_rate <= run(plan, trace, host=big * page).prompt_hit_rate


def test_requests_that_never_fit_are_each_rejected_one_after_another() -> None:
    """A step that only rejects is progress: three 48-token prompts in a row on
    a 12-page pool (one page held by the padding dummy) were taken for a stuck
    run ("no request can be scheduled") instead of three rejections."""
    rows = [(0,)] * 7 + [(0,) * 12] * 3
    trace = Trace(
        "t",
        np.array([4 * len(r) for r in rows], dtype=np.int64),
        np.ones(len(rows), dtype=np.int64),
        np.arange(len(rows), dtype=np.float64) * 10,
        hash_ids=tuple(rows),
        hash_block_tokens=4,
    )
    plan = toy_plan(12)
    for host in (None, 0, plan.spec.groups[0].slot_bytes):
        result = run(plan, trace, host=host)
        assert (result.rejected, result.finished) == (3, 7)


def test_a_tier_can_move_a_hit() -> None:
    """Served together, a bigger tier can lower the prompt hit rate without
    anything going wrong: with a 1-page host tier, request 4 (preempted)
    comes back onto its first page from the tier and computes 4 tokens fewer,
    so request 6 fits in the same step, before request 5 has computed the
    page request 6 would have reused; without the tier request 6 waits a step
    and hits it. Request 4's hit is a re-admission's, which the prompt hit
    rate does not count (docs/tiers.md)."""
    plan = toy_plan(12)
    rows = ((0,), (0,), (0,), (0,) * 5, (1, 0, 0, 0, 0), (0,) * 3, (0, 0)) + ((0,),) * 7
    outs = [1, 1, 1, 22, 2] + [1] * 9
    trace = Trace(
        "t", np.array([4 * len(r) for r in rows]), np.array(outs), np.zeros(14), hash_ids=rows, hash_block_tokens=4
    )
    bare, tiered = run(plan, trace, host=0), run(plan, trace, host=plan.spec.groups[0].slot_bytes)
    hits = [{x.rid: x.cached_tokens for x in r.requests if x.cached_tokens} for r in (bare, tiered)]
    assert hits == [{6: 4}, {}] and tiered.tiers is not None and tiered.tiers["pages_onboarded"] == 1
    assert bare.prompt_hit_rate > tiered.prompt_hit_rate == 0.0


def test_the_hit_rate_is_that_of_the_prompts_served() -> None:
    """The case that made the property above flaky: 12 pages, one held by the
    padding dummy; a 48-token prompt (12 pages) can never run. Without a tier
    its 10 cached pages and one chunk fit, it is admitted and rejected a step
    later; with a host tier holding its 11th page its hit is 11 pages, which
    leave no room for one more token: rejected at once. Its prompt is served
    in neither run, so it counts in neither hit rate: 4 of the other 68 tokens."""
    plan = toy_plan(12)
    prompts = [4, 4, 4, 4, 4, 44, 4, 48]
    rows = tuple((0,) * (p // 4) for p in prompts)
    trace = Trace("t", np.array(prompts), np.ones(8, dtype=np.int64), np.zeros(8), hash_ids=rows, hash_block_tokens=4)
    bare, tiered = run(plan, trace), run(plan, trace, host=plan.spec.groups[0].slot_bytes)
    for r in (bare, tiered):
        assert (r.finished, r.rejected) == (7, 1) and 7 not in {x.rid for x in r.requests}
        served = r.requests
        assert r.prompt_hit_rate == sum(x.cached_tokens for x in served) / sum(x.prompt_len for x in served) == 4 / 68


def test_a_host_tier_brings_back_what_the_gpu_evicted() -> None:
    """Two conversations of 16 pages, alternating, on a GPU pool of 20 pages:
    each evicts the other. Without a host tier every prompt after the first
    two is recomputed but for what survived; with 64 pages of host memory the
    whole earlier prompt comes back (all but its last page, which a prompt's
    last token always recomputes)."""
    a, b = tuple(range(16)), tuple(range(100, 116))
    rows = (a, b, a, b, a, b)
    trace = Trace(
        "t",
        np.full(6, 64, dtype=np.int64),
        np.ones(6, dtype=np.int64),
        np.arange(6, dtype=np.float64),  # one at a time
        hash_ids=rows,
        hash_block_tokens=4,
    )
    plan = toy_plan(20)
    bare = run(plan, trace)
    host = run(plan, trace, host=64 * plan.spec.groups[0].slot_bytes)
    assert host.prompt_hit_rate == pytest.approx(4 * 15 * 4 / (6 * 64))  # 4 later prompts reuse 15 pages of 4
    assert bare.prompt_hit_rate < host.prompt_hit_rate
    assert host.tiers is not None and host.tiers["pages_onboarded"] > 0
    assert host.tiers["transfer_s"] > 0 and host.makespan_s > 0


# ----------------------------------------------------------------------------- suspend and resume


def test_suspended_requests_come_back_with_their_pages() -> None:
    """A pool too small for the batch's growth: with a host tier, preempted
    requests are suspended, and every page that left comes back."""
    trace = Trace("t", np.full(6, 40, dtype=np.int64), np.full(6, 40, dtype=np.int64), np.zeros(6))
    plan = toy_plan(60)
    recompute = run(plan, trace, host=1 << 20)
    suspend = run(plan, trace, host=1 << 20, preemption="suspend")
    assert recompute.preemptions > 0 and suspend.finished == recompute.finished == 6
    t = suspend.tiers
    assert t is not None and t["suspensions"] > 0
    assert t["pages_suspended"] == t["pages_resumed"] > 0
    # a suspended request keeps its computed positions: no prefill runs twice
    assert suspend.steps <= recompute.steps


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_suspension_loses_no_page_and_no_request(data: st.DataObject) -> None:
    """Any trace, any host size: every request ends as with recompute (done or
    rejected, the same tokens), the tiers' books check out (`check=True`), no
    page stays used and every suspended page came back."""
    trace = prefix_trace(data)
    plan = toy_plan(data.draw(st.integers(12, 40)))
    host = data.draw(st.integers(0, 80)) * plan.spec.groups[0].slot_bytes
    recompute = run(plan, trace, host=host)
    suspend = run(plan, trace, host=host, preemption="suspend")
    assert suspend.finished + suspend.rejected == len(trace)
    assert (suspend.finished, suspend.output_tokens) == (recompute.finished, recompute.output_tokens)
    assert suspend.end_used == suspend.reserved
    assert suspend.tiers is not None and suspend.tiers["pages_suspended"] == suspend.tiers["pages_resumed"]


def test_suspension_needs_a_tier() -> None:
    from kvpool.errors import KvpoolError

    trace = Trace("t", np.array([8]), np.array([2]), np.zeros(1))
    with pytest.raises(KvpoolError, match="suspension needs a tier"):
        run(toy_plan(20), trace, preemption="suspend")
