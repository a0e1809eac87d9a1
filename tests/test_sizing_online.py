"""The online policy: tuned again between segments, switching (a restart) only on a margin."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.presets import load_gpu
from kvpool.sim import StepTimeModel, load_weights
from kvpool.sim.online import recent, serve_online
from kvpool.sim.tuned import DEFAULT_MARGIN
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.trace import Trace

GiB = 2**30
LIMITS = ServingLimits(max_seq_len=8192)


def gemma() -> ModelSpec:
    return load_model_spec("gemma-3-27b", max_seq_len=8192)


def reference_plan() -> PoolPlan:
    return plan_pools(gemma(), LIMITS, kv_memory_bytes=20 * GiB)


def traffic(prompts: Any, name: str = "t") -> Trace:
    p = np.asarray(prompts, dtype=np.int64)
    return Trace(name, p, np.full(len(p), 20, dtype=np.int64), np.zeros(len(p)))


def speed_at(share: float, trace: Trace) -> float:
    """A made-up engine: tok/s peaks at a sliding share that grows with the traffic's mean prompt."""
    peak = 0.15 + 0.6 * float(trace.prompt_len.mean()) / 4000
    return 100.0 * math.exp(-8.0 * (share - peak) ** 2)


def speed(plan: PoolPlan, trace: Trace) -> float:
    return speed_at(plan.group("sliding").share, trace)


def serve(plan: PoolPlan, trace: Trace) -> tuple[int, float]:
    tokens = int(trace.output_len.sum())
    return tokens, tokens / speed(plan, trace)


def online(seen: Trace, served: Trace, calls: list[Trace] | None = None, **kw: Any) -> Any:
    def counted(plan: PoolPlan, trace: Trace) -> tuple[int, float]:
        if calls is not None:
            calls.append(trace)
        return serve(plan, trace)

    return serve_online(gemma(), LIMITS, seen, served, None, kv_memory_bytes=20 * GiB, serve=counted, **kw)


def test_a_shift_in_the_traffic_is_followed_with_a_restart_and_beats_the_split_planned_once() -> None:
    seen, served = traffic([600] * 80), traffic([3400] * 80, "long")
    out = online(seen, served, segments=4)
    static = online(seen, served, segments=1)
    assert static.restarts == 0 and len(static.shares) == 1
    assert out.restarts >= 1 and out.shares[0] == static.shares[0] and out.shares[-1] > out.shares[0] + 0.2
    assert out.output_tokens == static.output_tokens == int(served.output_len.sum())
    assert out.output_tokens_per_s > 1.1 * static.output_tokens_per_s
    # the window still mixes the short traffic in, so the split that first beats the current
    # one on the long segment is the reference split, always a choice
    assert out.decisions[0].switched and out.shares[1] == pytest.approx(out.reference)
    assert "restart" in out.notes()[0] and "switched" in out.notes()[0]


def test_consecutive_segments_on_one_split_are_one_run() -> None:
    seen, served = traffic([600] * 80), traffic([600] * 40 + [3400] * 40)
    calls: list[Trace] = []
    out = online(seen, served, calls, segments=4)
    # the served runs are the last calls: one per stretch of segments on one split
    runs = out.restarts + 1
    shares = [x for i, x in enumerate(out.shares) if i == 0 or x != out.shares[i - 1]]
    assert runs == len(shares) == 2 and sum(len(t) for t in calls[-runs:]) == len(served)
    expected = sum(int(t.output_len.sum()) / speed_at(x, t) for x, t in zip(shares, calls[-runs:], strict=True))
    assert out.makespan_s == pytest.approx(expected)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.floats(0.0, 0.6),
    st.integers(2, 5),
    st.sampled_from([0.0, 0.02, 0.1]),
    st.sampled_from([None, 20, 60]),
)
def test_it_never_switches_to_a_split_slower_than_reference_on_the_traffic_it_tuned_on(
    seed: int, drift: float, segments: int, margin: float, window: int | None
) -> None:
    rng = np.random.default_rng(seed)
    n = 60
    seen = traffic(rng.integers(300, 2500, n))
    served = traffic(rng.integers(300, 2500, n) + (drift * 4000 * np.arange(n) / n).astype(np.int64))
    out = online(seen, served, segments=segments, margin=margin, window=window)
    ref = reference_plan()
    assert out.reference == pytest.approx(ref.group("sliding").share)
    assert len(out.shares) == segments and len(out.decisions) == segments - 1
    for d in out.decisions:
        before, after = out.shares[d.segment - 1], out.shares[d.segment]
        assert d.switched == (after != before)
        if d.switched:
            last = served.span(out.bounds[d.segment - 1], out.bounds[d.segment])
            new, now = speed_at(after, last), speed_at(before, last)
            assert new >= speed(ref, last) and new > (1 + margin) * now
            assert d.gain > 1 + margin and d.share == after


@settings(max_examples=25, deadline=None)
@given(st.integers(200, 3800), st.integers(1, 5), st.floats(0.0, 0.2), st.sampled_from([None, 10, 45]))
def test_no_switch_when_the_recent_traffic_is_the_planning_traffic(
    prompt: int, segments: int, margin: float, window: int | None
) -> None:
    calls: list[Trace] = []
    out = online(traffic([prompt] * 50), traffic([prompt] * 50), calls, segments=segments, margin=margin, window=window)
    assert out.restarts == 0 and len(set(out.shares)) == 1
    assert all(d.gain == 1.0 and d.candidate == out.decisions[0].candidate for d in out.decisions)
    assert len(calls[-1]) == 50  # the one served run


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(1, 50), st.integers(0, 50), st.integers(1, 120))
def test_the_window_is_the_most_recent_requests(n_seen: int, n_served: int, upto: int, window: int) -> None:
    upto = min(upto, n_served)
    seen = traffic(np.arange(1, n_seen + 1))
    served = traffic(np.arange(1001, 1001 + n_served))
    if upto == 0 and window == 0:
        return
    w = recent(seen, served, upto, window)
    history = [*range(1, n_seen + 1), *range(1001, 1001 + upto)]
    assert w.prompt_len.tolist() == history[-window:]
    assert w.arrival_s is not None and (np.diff(w.arrival_s) >= 0).all()


@pytest.mark.parametrize(("gain", "adopted"), [(0.005, False), (0.03, True)])
def test_it_tunes_with_tuneds_margin_so_a_gain_within_the_noise_keeps_the_reference_split(
    gain: float, adopted: bool
) -> None:
    """Every split but the reference's is `gain` faster on every part: within the
    tuned margin (1 %) online starts on the reference split and never leaves it,
    as `tune` keeps it; past it, it starts on a tuned split as `tune` does."""
    ref = reference_plan().group("sliding").share

    def flat(plan: PoolPlan, trace: Trace) -> tuple[int, float]:
        tokens = int(trace.output_len.sum())
        faster = abs(plan.group("sliding").share - ref) > 1e-3
        return tokens, tokens / (100.0 * (1 + gain * faster))

    t = traffic(np.random.default_rng(5).integers(300, 2500, 60))
    out = serve_online(gemma(), LIMITS, t, t, None, kv_memory_bytes=20 * GiB, serve=flat, segments=3)
    assert 0.005 < DEFAULT_MARGIN < 0.03  # the two gains lie on either side of it
    assert (out.shares[0] != pytest.approx(ref, abs=1e-3)) == adopted
    if not adopted:
        assert out.restarts == 0 and all(s == pytest.approx(ref, abs=1e-3) for s in out.shares)
        assert all(d.candidate == pytest.approx(ref, abs=1e-3) for d in out.decisions)


def test_bad_settings_raise() -> None:
    t = traffic([500] * 10)
    for kw in ({"segments": 0}, {"segments": 11}, {"margin": 1.0}, {"margin": -0.1}, {"window": 0}):
        with pytest.raises(KvpoolError):
            online(t, t, **kw)
    with pytest.raises(KvpoolError, match="step-time model"):
        serve_online(gemma(), LIMITS, t, t, None, kv_memory_bytes=20 * GiB)


def test_on_the_simulator_it_serves_every_request_and_switches_only_past_the_margin() -> None:
    spec = gemma()
    steps = StepTimeModel.build(spec, load_gpu("h100"), load_weights("gemma-3-27b"))
    rng = np.random.default_rng(3)
    seen, served = (traffic(rng.integers(200, 2000, 40)) for _ in range(2))
    out = serve_online(spec, LIMITS, seen, served, steps, kv_memory_bytes=4 * GiB, segments=2, margin=0.5)
    assert out.output_tokens == int(served.output_len.sum())
    assert out.restarts == 0 or out.decisions[0].gain > 1.5
    assert out.output_tokens_per_s > 0 and out.wall_s > 0
