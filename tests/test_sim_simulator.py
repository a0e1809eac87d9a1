"""The simulator: a hand-computed run, conservation, determinism, the fast
path, prefix reuse and the starved-sliding-pool failure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.plan import PoolPlan, ServingLimits
from kvpool.presets.traces import Trace, load_trace
from kvpool.sched import Sequence, Step
from kvpool.sim import Progress, SimResult, StepTimeModel, Weights, simulate
from kvpool.sim.metrics import linear_percentile
from kvpool.sim.steptime import KERNELS_PER_LAYER, KERNELS_PER_STEP, LAUNCH_S, REPLAY_S
from kvpool.spec import ModelSpec
from sim_helpers import toy_gpu, toy_spec

GPU = toy_gpu()
WEIGHTS = Weights(1e9, 1e9, 2.0)  # 2 GB of weights: every small step is memory bound
EAGER = LAUNCH_S * (KERNELS_PER_LAYER * 2 + KERNELS_PER_STEP)


def plan(pages: dict[str, int], spec: ModelSpec | None = None, **limits: object) -> PoolPlan:
    limits.setdefault("max_batch_size", 8)
    limits.setdefault("max_seq_len", 64)
    limits.setdefault("max_num_tokens", 16)
    spec = spec or toy_spec()
    return PoolPlan.from_pages(spec, pages, ServingLimits(**limits))  # type: ignore[arg-type]


def trace(lengths: list[tuple[int, int]], arrivals: list[float] | None = None) -> Trace:
    return Trace(
        "t",
        np.array([p for p, _ in lengths], dtype=np.int64),
        np.array([o for _, o in lengths], dtype=np.int64),
        None if arrivals is None else np.array(arrivals, dtype=np.float64),
    )


def run(p: PoolPlan, t: Trace, **kw: object) -> SimResult:
    model = StepTimeModel.build(p.spec, GPU, WEIGHTS, "roofline")
    return simulate(p, t, model, check=True, **kw)  # type: ignore[arg-type]


def assert_no_leak(r: SimResult) -> None:
    assert r.end_used == r.reserved, f"pages still used {r.end_used}, reserved {r.reserved}"


# ----------------------------------------------------------------------------- by hand


def test_one_request_by_hand() -> None:
    """Prompt 4, output 3 on the toy model (row 256 bytes per position over both
    layers, 2e9 weight bytes at 1 TB/s): one prefill step, two decode steps."""
    r = run(plan({"full": 100}), trace([(4, 3)], [0.0]))
    # prefill of 4 positions: reads 4 keys, writes 4 rows; eager
    t1 = (2e9 + 256 * (4 + 4)) / 1e12 + EAGER
    # decodes at history 4 and 5: read 5 / 6 keys, write 1 row; batch 1 is captured: graph
    t2 = (2e9 + 256 * (5 + 1)) / 1e12 + REPLAY_S
    t3 = (2e9 + 256 * (6 + 1)) / 1e12 + REPLAY_S
    assert r.finished == 1 and r.output_tokens == 3
    assert r.ttft_s.tolist() == pytest.approx([t1], rel=1e-12)
    assert r.tpot_s.tolist() == pytest.approx([(t2 + t3) / 2], rel=1e-12)
    assert r.makespan_s == pytest.approx(t1 + t2 + t3, rel=1e-12)
    assert r.output_tokens_per_s == pytest.approx(3 / (t1 + t2 + t3), rel=1e-12)
    assert (r.steps, r.decode_steps, r.graph_steps) == (3, 2, 2)
    # peak pages: 6 positions + the in-flight one -> capacity 7 -> 2 pages, +1 padding dummy
    assert r.pages["full"].peak_used == 3 and r.reserved == {"full": 1}
    assert_no_leak(r)


def test_clock_jumps_to_the_next_arrival() -> None:
    r = run(plan({"full": 100}), trace([(4, 1), (4, 1)], [0.0, 10.0]))
    t = (2e9 + 256 * 8) / 1e12 + EAGER  # each is one prefill step that samples its only token
    assert r.ttft_s.tolist() == pytest.approx([t, t], rel=1e-12)
    assert r.makespan_s == pytest.approx(10.0 + t, rel=1e-12)


def test_padded_decode_batch_replays_a_graph() -> None:
    # three requests decode together: 3 rows pad to the captured size 4
    r = run(plan({"full": 100}), trace([(4, 3)] * 3, [0.0] * 3))
    assert r.decode_steps == 2 and r.graph_steps == 2 and r.graph_step_share == 1.0
    assert_no_leak(r)


# ----------------------------------------------------------------------------- conservation


@pytest.mark.parametrize(
    ("pages", "window", "budget"),
    [
        ({"full": 60}, None, 16),
        ({"full": 18}, None, 8),  # tight (17 pages after the padding dummy)
        ({"sliding": 9, "full": 40}, 8, 12),  # starved window pool
        ({"sliding": 30, "full": 30}, 8, None),  # no chunked-prefill budget
    ],
)
def test_every_request_gets_its_tokens_and_no_page_leaks(
    pages: dict[str, int], window: int | None, budget: int | None
) -> None:
    rng = np.random.default_rng(7)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 40, 60), rng.integers(1, 30, 60), strict=True)]
    lengths += [(64, 5), (70, 1)]  # prompts of at least L = 64: rejected up front
    arrivals = np.sort(rng.uniform(0, 0.05, len(lengths))).tolist()
    p = plan(pages, toy_spec(window=window), max_num_tokens=budget)
    r = run(p, trace(lengths, arrivals))
    expected = sum(min(o, 64 - pr) for pr, o in lengths if pr < 64)
    assert r.rejected == 2 and r.finished == len(lengths) - 2
    assert r.output_tokens == expected
    assert len(r.ttft_s) == r.finished
    assert_no_leak(r)


def test_tight_pool_preempts_and_still_finishes() -> None:
    lengths = [(30, 20)] * 6
    r = run(plan({"full": 20}), trace(lengths, [0.0] * 6))
    assert r.preemptions > 0 and r.finished == 6 and r.output_tokens == 120
    assert_no_leak(r)


# ----------------------------------------------------------------------------- determinism


def test_same_seed_same_numbers_other_seed_other_numbers() -> None:
    p = plan({"full": 40})
    base = trace([(10 + i % 17, 1 + i % 9) for i in range(80)])
    a = run(p, base.with_rate(200.0, seed=3)).to_json()
    b = run(p, base.with_rate(200.0, seed=3)).to_json()
    c = run(p, base.with_rate(200.0, seed=4)).to_json()
    assert json.dumps(a) == json.dumps(b)
    assert a != c


def test_fast_path_matches_step_by_step() -> None:
    rng = np.random.default_rng(11)
    lengths = [(int(p), int(o)) for p, o in zip(rng.integers(1, 30, 40), rng.integers(1, 40, 40), strict=True)]
    arrivals = np.sort(rng.uniform(0, 0.5, 40)).tolist()
    for pages, window in (({"full": 200}, None), ({"sliding": 40, "full": 100}, 8), ({"full": 25}, None)):
        p = plan(pages, toy_spec(window=window))
        fast = run(p, trace(lengths, arrivals), fast=True)
        slow = run(p, trace(lengths, arrivals), fast=False)
        assert fast.steps == slow.steps and fast.graph_steps == slow.graph_steps
        assert fast.preemptions == slow.preemptions
        assert fast.pages[next(iter(pages))].peak_used == slow.pages[next(iter(pages))].peak_used
        for key in ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s"):
            assert math.isclose(fast.to_json()[key], slow.to_json()[key], rel_tol=1e-9), key


class CountingHook:
    """A hook that only counts what the loop hands it (`StepHook`)."""

    def __init__(self) -> None:
        self.scheduled_steps = self.after_steps = self.done = 0

    def scheduled(self, step: Step) -> None:
        self.scheduled_steps += 1

    def finished(self, seq: Sequence) -> None:
        self.done += 1

    def after_step(self, steps: int, now: float) -> None:
        self.after_steps += 1


def test_a_hooked_run_is_the_step_by_step_run_and_sees_every_step_and_finish() -> None:
    # rebalancing drives the same loop through a hook: a hook that changes
    # nothing must leave the run as it is without one, step by step
    p = plan({"full": 25})
    t = trace([(5 + i % 23, 1 + i % 31) for i in range(40)], [i * 0.002 for i in range(40)])
    hook = CountingHook()
    hooked = run(p, t, hook=hook)
    slow = run(p, t, fast=False)
    assert hooked.to_json() == slow.to_json()
    assert (hooked.steps, hooked.graph_steps, hooked.end_used) == (slow.steps, slow.graph_steps, slow.end_used)
    assert hook.scheduled_steps == hook.after_steps == hooked.steps
    assert hook.done == hooked.finished


# ----------------------------------------------------------------------------- reuse


def test_mooncake_hash_ids_become_reuse_hits(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]},
        {"timestamp": 1000, "input_length": 700, "output_length": 2, "hash_ids": [0, 2]},
        {"timestamp": 2000, "input_length": 800, "output_length": 2, "hash_ids": [0, 3]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = load_trace(path)
    p = plan({"full": 400}, toy_spec(tpb=32), max_seq_len=2048, max_num_tokens=1024)
    r = run(p, t)
    # requests 2 and 3 reuse block 0 = 512 tokens = 16 pages of 32; queried 600 + 700 + 800
    assert r.reuse_hit_rate == pytest.approx(1024 / 2100)
    off = run(p, t, reuse=False)
    assert off.reuse_hit_rate == 0.0
    # reused tokens are not recomputed: the second and third TTFT are shorter
    assert r.ttft_s[1] < off.ttft_s[1] and r.ttft_s[2] < off.ttft_s[2]
    assert_no_leak(r)


# ----------------------------------------------------------------------------- the failure


def test_starved_sliding_pool_costs_throughput() -> None:
    """Same bytes, two splits of a window-8 model: a window pool that holds all
    8 requests versus one that holds about two."""
    spec = toy_spec(window=8)
    lengths = [(12, 40)] * 24
    # a decode at full window needs ceil((8 + 1 - 1)/4) + 1 = 3 window pages
    balanced = run(plan({"sliding": 24, "full": 120}, spec), trace(lengths, [0.0] * 24))
    starved = run(plan({"sliding": 7, "full": 137}, spec), trace(lengths, [0.0] * 24))
    assert balanced.preemptions == 0 < starved.preemptions
    assert starved.output_tokens_per_s < 0.8 * balanced.output_tokens_per_s
    assert balanced.finished == starved.finished == 24
    assert_no_leak(starved)


def test_lazy_padding_dummy_fails_when_the_pool_is_full() -> None:
    """Without the reservation, a decode-only step that finds the window pool
    full has no padding dummy and runs eagerly; the reserved dummy never fails."""
    spec = toy_spec(window=8)
    lengths = [(12, 40)] * 24
    p = plan({"sliding": 8, "full": 136}, spec)
    lazy = run(p, trace(lengths, [0.0] * 24), padding=False)
    reserved = run(p, trace(lengths, [0.0] * 24), padding=True)
    assert reserved.padding_failures == 0 and reserved.reserved == {"sliding": 1, "full": 1}
    assert lazy.padding_failures > 0 and lazy.reserved == {"sliding": 0, "full": 0}
    assert lazy.graph_steps + lazy.padding_failures <= lazy.decode_only_steps
    assert_no_leak(lazy)


def test_progress_is_reported_every_n_steps() -> None:
    seen: list[Progress] = []
    p = plan({"full": 100})
    model = StepTimeModel.build(p.spec, GPU, WEIGHTS, "roofline")
    r = simulate(
        p, trace([(4, 3)] * 5, [0.0, 1.0, 2.0, 3.0, 4.0]), model, fast=False, progress=seen.append, progress_every=2
    )
    # 5 requests x (1 prefill + 2 decodes) = 15 steps, reported after steps 2, 4, ..., 14
    assert r.steps == 15 and len(seen) == 7
    assert seen[-1].total == 5 and seen[-1].done <= 5
    assert all(a.sim_time_s <= b.sim_time_s for a, b in zip(seen, seen[1:], strict=False))


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(0, 1e4), st.floats(-1e300, 1e300), st.sampled_from([0.0, 1.5, math.inf, math.nan])),
        min_size=1,
        max_size=40,
    ),
    q=st.one_of(st.sampled_from([0, 50, 99, 100, 99.9]), st.floats(0, 100), st.integers(0, 100)),
)
def test_the_results_percentile_is_numpys_to_the_bit(values: list[float], q: float) -> None:
    """`linear_percentile` (SimResult's) gives np.percentile's float, bit for bit."""
    arr = np.array(values)
    with np.errstate(invalid="ignore"):  # inf - inf in NumPy's lerp, on both paths
        want = float(np.percentile(arr, q))
        got = linear_percentile(arr, q)
    assert (math.isnan(got) and math.isnan(want)) or np.float64(got).tobytes() == np.float64(want).tobytes()
