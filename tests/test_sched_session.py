"""The session's warmup: on a fresh manager the dry run's report is the plan's
page arithmetic and its padding dummies the manager's; a run after it is the
run after the real dry run (the thousands of dummies allocated and freed)."""

from __future__ import annotations

import importlib
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import KVCacheManager, WarmupReport
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sim import StepTimeModel, Weights, simulate
from kvpool.trace import Trace
from sim_helpers import toy_gpu, toy_spec

session = importlib.import_module("kvpool.sched.session")  # the module (`kvpool.sched.session` is its function)


def real_dry_run(manager: KVCacheManager, plan: PoolPlan, draft_lens: tuple[int, ...]) -> WarmupReport:
    return manager.warmup(plan.limits.graph_batch_sizes, draft_lens=draft_lens)


@st.composite
def plans(draw: st.DrawFn) -> PoolPlan:
    spec = toy_spec(tpb=draw(st.sampled_from([1, 4])), window=draw(st.sampled_from([None, 6, 20])))
    b = draw(st.integers(1, 8))
    limits = ServingLimits(
        max_batch_size=b,
        max_seq_len=draw(st.integers(8, 200)),
        max_num_tokens=draw(st.integers(8, 64)),
        cuda_graph_batch_sizes=tuple(draw(st.sets(st.integers(1, b), min_size=1, max_size=4))),
    )
    return PoolPlan.from_pages(spec, {g.name: draw(st.integers(4, 120)) for g in spec.groups}, limits)


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(1, 10))
    convs = [tuple(range(k * 100, k * 100 + 8)) for k in range(3)]  # prompts share leading blocks
    rows = [convs[draw(st.integers(0, 2))][: draw(st.integers(1, 8))] for _ in range(n)]
    return Trace(
        "t",
        np.array([4 * len(r) for r in rows], dtype=np.int64),
        np.array([draw(st.integers(1, 40)) for _ in rows], dtype=np.int64),
        np.cumsum([draw(st.sampled_from([0.0, 0.001, 0.01])) for _ in rows]),
        hash_ids=tuple(rows),
        hash_block_tokens=4,
    )


@settings(max_examples=15, deadline=None)
@given(plans(), traces(), st.booleans())
def test_a_run_after_the_counted_warmup_is_the_run_after_the_real_one(
    plan: PoolPlan, trace: Trace, padding: bool
) -> None:
    fresh = session.session(plan)
    with mock.patch.object(session, "fresh_warmup", real_dry_run):
        real = session.session(plan)
    assert fresh.warmup == real.warmup  # captured, lengths, skipped, padding ids, reserved pages
    for group in plan.spec.groups:
        assert fresh.manager.free_pages(group.name) == real.manager.free_pages(group.name)
    model = StepTimeModel.build(plan.spec, toy_gpu(), Weights(1e9, 1e9, 2.0), "roofline")
    runs = []
    for dry_run in (session.fresh_warmup, real_dry_run):
        with mock.patch.object(session, "fresh_warmup", dry_run):
            result = simulate(plan, trace, model, padding=padding, check=True)
        runs.append({k: v for k, v in result.to_json().items() if k != "wall_s"})
    assert runs[0] == runs[1]
