"""The tuned policy: the sample it simulates and the bounded search over the split."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.presets import load_gpu
from kvpool.sim import StepTimeModel, load_weights, simulate
from kvpool.sim.policies import plan_for
from kvpool.sim.tuned import DEFAULT_MARGIN, mean_gain, pick, sample_trace, trace_folds, tune, tuned_group
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.trace import Trace

GiB = 2**30


def gemma() -> ModelSpec:
    return load_model_spec("gemma-3-27b", max_seq_len=8192)


def trace(n: int = 40) -> Trace:
    rng = np.random.default_rng(1)
    return Trace("t", rng.integers(500, 3000, n), rng.integers(5, 60, n), np.zeros(n))


def tune_gemma(run: Any = None, **kw: Any) -> Any:
    """`tune` on gemma-3-27b at L = 8192 with 20 GiB and the 40-request trace, runs
    timed by `run(plan, fold)` (no simulator, no step model)."""
    return tune(gemma(), ServingLimits(max_seq_len=8192), trace(), None, kv_memory_bytes=20 * GiB, run=run, **kw)  # type: ignore[arg-type]


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
    calls: list[tuple[float, str]] = []

    def fake(plan: PoolPlan, part: Trace) -> float:
        share = plan.group("sliding").share
        calls.append((share, part.name))
        return 100.0 * math.exp(-10.0 * (share - 0.3) ** 2)  # tok/s, highest at 0.3

    out = tune_gemma(fake, extra_shares=(0.9,), max_evals=11)
    assert tuned_group(gemma()) == "sliding" and out.group == "sliding"
    # at most 11 candidates and the reference on the sample, then the 3 best and the
    # reference on each of the 2 checks
    sampled = [c for c in calls if c[1].endswith("(sample)")]
    assert len(out.evals) <= 11 and len(sampled) == len(out.evals) + 1 and len(calls) == len(sampled) + 2 * 4
    assert 0.9 in [s for s, _ in out.evals]
    assert abs(out.share - 0.3) < 0.05 and not out.fallback
    assert out.plan.policy == "tuned" and out.plan.group("sliding").share == pytest.approx(out.share, abs=1e-3)
    note = out.notes()[0]
    assert "the search on a 20-request sample" in note and "2 other parts of it (10/10 requests)" in note, note
    assert f"{len(calls)} simulator runs" in note and "faster than the reference split" in note


def reference_share() -> float:
    return (
        plan_for(gemma(), ServingLimits(max_seq_len=8192), "reference", kv_memory_bytes=20 * GiB)
        .plan.group("sliding")
        .share
    )


def at(plan: PoolPlan, share: float) -> bool:
    return abs(plan.group("sliding").share - share) < 0.02


def test_the_reference_split_is_kept_unless_a_candidate_wins_the_sample_and_the_checks_mean() -> None:
    ref_plan = plan_for(gemma(), ServingLimits(max_seq_len=8192), "reference", kv_memory_bytes=20 * GiB).plan
    ref = reference_share()

    def flat(plan: PoolPlan, _: Trace) -> float:
        return 1.0

    def loses_the_checks_mean(plan: PoolPlan, part: Trace) -> float:
        # 0.3 beats the reference by 10 % on the sample, 1 % on the first check, loses 5 % on the second
        if at(plan, ref):
            return 100.0
        if at(plan, 0.3):
            return {"sample": 110.0, "fold 1": 101.0, "fold 2": 95.0}[part.name.split("(")[-1][:-1]]
        return 50.0

    for run in (flat, loses_the_checks_mean):
        out = tune_gemma(run, extra_shares=(0.3,))
        assert out.fallback and out.share == pytest.approx(ref, abs=1e-3)
        assert out.plan.pages("sliding") == ref_plan.pages("sliding"), "the reference split itself"
        assert "kept the reference split" in out.notes()[0]


def test_one_check_lost_by_a_little_does_not_pass_over_the_best_split() -> None:
    """gemma-2-9b on code (docs/sim.md): the sample's best lost 2.6 % on one check
    and won the other by 4.1 %; the every-check rule took a split 1.6 % slower on
    the served traffic. The checks' mean keeps it, as the mean over all parts ranks it."""
    ref = reference_share()
    gains = {0.3: (1.040, 1.041, 0.974), 0.45: (1.008, 1.034, 1.027)}  # gemma-2-9b's two candidates

    def run(plan: PoolPlan, part: Trace) -> float:
        j = ["sample", "fold 1", "fold 2"].index(part.name.split("(")[-1][:-1])
        share = next((s for s in gains if at(plan, s)), None)
        return 100.0 if at(plan, ref) or share is None else 100.0 * gains[share][j]

    out = tune_gemma(run, extra_shares=tuple(gains), max_evals=7)
    # the sample has twice the requests of a check: 0.3 gains 2.2 % over the three parts, 0.45 1.9 %
    assert out.fold_sizes == (20, 10, 10)
    assert not out.fallback and out.share == pytest.approx(0.3, abs=1e-3)
    assert "+4.0 %, +4.1 %, -2.6 %" in out.notes()[0]


def test_a_gain_within_the_noise_between_neighbouring_splits_keeps_the_reference_split() -> None:
    """gemma-2-9b on an RTX 5090 (docs/sim.md): share 0.498 beside the reference's
    0.500 gained +0.9 % on the sample and +0.6, -0.5 % on the checks, +0.5 % over
    them all, and served 1.1 % below the reference split. Under the margin it is
    not adopted; without one it would be."""
    ref = reference_share()
    near, gains = ref - 0.05, (1.009, 1.006, 0.995)  # the sample, then the two checks

    def near_reference(plan: PoolPlan, part: Trace) -> float:
        j = ["sample", "fold 1", "fold 2"].index(part.name.split("(")[-1][:-1])
        return 100.0 if at(plan, ref) else 100.0 * gains[j] if at(plan, near) else 99.0

    sizes = (1000, 500, 500)  # the default sample and checks
    assert 1 < mean_gain(gains, sizes) < 1 + DEFAULT_MARGIN
    assert pick({0.498: list(gains)}, sizes) is None
    assert pick({0.498: list(gains)}, sizes, margin=0.0) == 0.498
    out = tune_gemma(near_reference, extra_shares=(near,))
    assert out.fallback and out.margin == DEFAULT_MARGIN and "by more than 1 % over them all" in out.notes()[0]
    assert tune_gemma(near_reference, extra_shares=(near,), margin=0.0).share == pytest.approx(near, abs=1e-3)
    with pytest.raises(KvpoolError, match="margin"):
        tune_gemma(margin=1.0)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.002, 0.4), st.sampled_from([0.0, DEFAULT_MARGIN, 0.05]))
def test_the_tuned_split_is_never_slower_than_reference_on_the_traffic_it_was_tuned_on(
    seed: int, spread: float, margin: float
) -> None:
    """Any throughput landscape (random per split and part, some splits infeasible;
    spreads from below the margin to far above it): the tuned split is at least as
    fast as the reference split on the sample and on the checks' request-weighted
    geometric mean, and faster by more than the margin over them all, measured here
    by running both."""
    ref = reference_share()

    def run(plan: PoolPlan, part: Trace) -> float:
        share = round(plan.group("sliding").share, 3)
        rng = np.random.default_rng([seed, int(share * 1000), sum(map(ord, part.name))])
        if rng.random() < 0.1 and not at(plan, ref):
            raise KvpoolError("does not fit")
        return float(100.0 * np.exp(rng.normal(0.0, spread)))

    out = tune_gemma(run, margin=margin)
    ref_plan = plan_for(gemma(), ServingLimits(max_seq_len=8192), "reference", kv_memory_bytes=20 * GiB).plan
    parts = trace_folds(trace(), 1000, 2, 500)
    gain = [run(out.plan, p) / run(ref_plan, p) for p in parts]
    weights = [len(p) for p in parts]
    assert gain[0] >= 1
    assert np.average(np.log(gain[1:]), weights=weights[1:]) >= -1e-12
    if out.fallback:
        assert out.plan.pages("sliding") == ref_plan.pages("sliding")
    else:
        assert gain[0] > 1 and np.average(np.log(gain), weights=weights) > math.log1p(margin)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.floats(0.01, 0.99),
        st.lists(st.floats(0.0, 3.0) | st.just(math.inf), min_size=3, max_size=3),
        max_size=4,
    ),
    st.lists(st.integers(1, 1000), min_size=3, max_size=3),
    st.sampled_from([0.0, 0.005, DEFAULT_MARGIN, 0.03]),
)
def test_pick_takes_the_best_mean_among_those_that_win_the_sample_the_checks_mean_and_the_margin(
    ratios: dict[float, list[float]], sizes: list[int], margin: float
) -> None:
    def log_mean(r: list[float], n: list[int]) -> float:
        ok = all(0 < x < math.inf for x in r)
        return float(np.average(np.log(r), weights=n)) if ok else -math.inf

    eligible = {
        s: r
        for s, r in ratios.items()
        if 1 < r[0] < math.inf and log_mean(r[1:], sizes[1:]) >= 0 and log_mean(r, sizes) > math.log1p(margin)
    }
    chosen = pick(ratios, tuple(sizes), margin)
    if not eligible:
        assert chosen is None
        return
    assert chosen in eligible
    # faster than reference by more than the margin over the tuning traffic
    assert log_mean(ratios[chosen], sizes) > math.log1p(margin)
    best = max(log_mean(r, sizes) for r in eligible.values())
    assert log_mean(ratios[chosen], sizes) == pytest.approx(best, abs=1e-12)


def test_reference_errors() -> None:
    def never(plan: PoolPlan, _: Trace) -> float:
        raise KvpoolError("does not fit")

    with pytest.raises(KvpoolError, match="reference split"):
        tune_gemma(never)
    with pytest.raises(KvpoolError, match="max_evals"):
        tune_gemma(max_evals=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 1200), st.integers(1, 5), st.integers(1, 800))
def test_sample_and_checks_are_disjoint_blocks_spread_over_the_trace(n: int, size: int, folds: int, fold: int) -> None:
    times = np.cumsum(np.arange(n, dtype=float) % 5)
    t = Trace("t", np.arange(1, n + 1), np.ones(n, dtype=np.int64), times)
    parts = trace_folds(t, size, folds, fold)
    assert len(parts) == 1 + min(folds, 4)
    ids = [p.prompt_len.tolist() for p in parts]
    if n < 8:  # too short to cut: every part is the whole trace
        assert all(i == list(range(1, n + 1)) for i in ids)
        return
    seg = n // 8
    assert len(ids[0]) == 4 * min(seg, max(1, size // 4))
    every = [i for part in ids for i in part]
    assert len(every) == len(set(every))  # disjoint
    for part in parts:
        assert part.arrival_s is not None and part.arrival_s[0] == 0 and (np.diff(part.arrival_s) >= 0).all()
    # the sample's blocks start the even segments, the checks' the odd ones
    starts = {i for part in ids for i in part if (i - 1) % seg == 0 and (i - 1) // seg < 8}
    assert {(i - 1) // seg for i in starts if i in ids[0]} == {0, 2, 4, 6}
    assert {(i - 1) // seg for part in ids[1:] for i in part if i in starts} <= {1, 3, 5, 7}


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
