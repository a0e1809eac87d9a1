"""The tuned policy: the sample it simulates and the bounded search over the split."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.presets import load_gpu
from kvpool.sim import StepTimeModel, load_weights, simulate
from kvpool.sim.policies import plan_for
from kvpool.sim.tuned import sample_trace, tune, tuned_group
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.trace import Trace

GiB = 2**30


def gemma() -> ModelSpec:
    return load_model_spec("gemma-3-27b", max_seq_len=8192)


def trace(n: int = 40) -> Trace:
    rng = np.random.default_rng(1)
    return Trace("t", rng.integers(500, 3000, n), rng.integers(5, 60, n), np.zeros(n))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 120), st.integers(1, 6))
def test_sample_is_contiguous_blocks_in_time_order(n: int, size: int, chunks: int) -> None:
    times = np.cumsum(np.arange(n, dtype=float) % 7)
    t = Trace("t", np.arange(1, n + 1), np.ones(n, dtype=np.int64), times - times[0])
    s = sample_trace(t, size, chunks)
    assert len(s) == (n if n <= size else (size // min(chunks, size)) * min(chunks, size))
    assert s.arrival_s is not None and (np.diff(s.arrival_s) >= 0).all()
    assert set(s.prompt_len.tolist()) <= set(t.prompt_len.tolist())
    if n > size:  # ids are request numbers: blocks of consecutive ones
        breaks = int((np.diff(s.prompt_len) != 1).sum())
        k = min(chunks, size)
        assert breaks <= k - 1
        assert s.prompt_len[0] == 1 and (k == 1 or s.prompt_len[-1] == n)


def test_search_finds_a_known_optimum_within_its_budget() -> None:
    calls: list[float] = []

    def fake(plan: PoolPlan, _: Trace) -> float:
        share = plan.group("sliding").share
        calls.append(share)
        return 100.0 - 1000.0 * (share - 0.3) ** 2

    out = tune(
        gemma(),
        ServingLimits(max_seq_len=8192),
        trace(),
        None,  # type: ignore[arg-type]
        kv_memory_bytes=20 * GiB,
        run=fake,
        extra_shares=(0.9,),
        max_evals=11,
    )
    assert tuned_group(gemma()) == "sliding" and out.group == "sliding"
    assert len(calls) == len(out.evals) <= 11 and 0.9 in [s for s, _ in out.evals]
    assert abs(out.share - 0.3) < 0.05 and max(v for _, v in out.evals) > 98
    assert out.plan.policy == "tuned" and out.plan.group("sliding").share == pytest.approx(out.share, abs=1e-3)
    assert "simulator runs on a 40-request sample" in out.notes()[0]


def test_ties_keep_the_analytical_start_and_infeasible_splits_lose() -> None:
    starts: list[float] = []

    def flat(plan: PoolPlan, _: Trace) -> float:
        starts.append(plan.group("sliding").share)
        return 1.0

    out = tune(
        gemma(),
        ServingLimits(max_seq_len=8192),
        trace(),
        None,  # type: ignore[arg-type]
        kv_memory_bytes=20 * GiB,
        run=flat,
    )
    assert out.share == pytest.approx(starts[0], abs=1e-3)

    def never(plan: PoolPlan, _: Trace) -> float:
        raise KvpoolError("does not fit")

    with pytest.raises(KvpoolError, match="no split"):
        tune(
            gemma(),
            ServingLimits(max_seq_len=8192),
            trace(),
            None,  # type: ignore[arg-type]
            kv_memory_bytes=20 * GiB,
            run=never,
        )
    with pytest.raises(KvpoolError, match="max_evals"):
        tune(
            gemma(),
            ServingLimits(max_seq_len=8192),
            trace(),
            None,  # type: ignore[arg-type]
            kv_memory_bytes=20 * GiB,
            max_evals=0,
        )


def test_tuned_policy_beats_or_matches_reference_on_its_sample() -> None:
    """A real search on a 20-request trace (the sample is the whole trace): the
    tuned split is at least as fast as the reference split on it."""
    spec = gemma()
    limits = ServingLimits(max_batch_size=32, max_seq_len=8192, max_num_tokens=2048)
    t = trace(20)
    model = StepTimeModel.build(spec, load_gpu("h100"), load_weights("gemma-3-27b"))
    kv = int(0.75 * GiB)
    tuned = plan_for(spec, limits, "tuned", kv_memory_bytes=kv, trace=t, model=model)
    ref = plan_for(spec, limits, "reference", kv_memory_bytes=kv)
    assert tuned.plan.policy == "tuned"
    assert any(n.startswith("occupancy:") for n in tuned.notes)
    assert any(n.startswith("tuned:") for n in tuned.notes)
    a = simulate(tuned.plan, t, model).output_tokens_per_s
    b = simulate(ref.plan, t, model).output_tokens_per_s
    assert a >= b and math.isfinite(a)
    occ = plan_for(spec, limits, "occupancy", kv_memory_bytes=kv, trace=t)
    assert occ.plan.policy == "occupancy"
    with pytest.raises(KvpoolError, match="step-time model"):
        plan_for(spec, limits, "tuned", kv_memory_bytes=kv, trace=t)
    with pytest.raises(KvpoolError, match="needs a trace"):
        plan_for(spec, limits, "occupancy", kv_memory_bytes=kv)
