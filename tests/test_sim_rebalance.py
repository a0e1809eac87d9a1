"""Online rebalancing: the ballast never takes a live or reserved page, the
bytes never exceed the budget, a dry run changes nothing, and on a trace whose
mix shifts half-way the online split beats every split of a static sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import STALE
from kvpool.plan import ServingLimits
from kvpool.sim import simulate
from kvpool.sim.ballast import BallastPools, RebalanceError, pages_for_share
from kvpool.sim.policies import plan_for, ratio_policy
from kvpool.sim.rebalance import Rebalancer
from kvpool.sim.rebalance_sim import simulate_rebalanced
from kvpool.spec import load_model_spec
from kvpool.trace import Trace
from rebalance_helpers import shifting_case, small_plan


def live_outside_ballast(pools: BallastPools, group: str) -> int:
    """Distinct pages held by requests and padding dummies (everything but
    the ballast; a reused prefix page counts once)."""
    ballast = {rid for rid, _, _ in pools.units}
    m, pages = pools.manager, set()
    for rid, _ in m.iter_requests():
        if rid not in ballast:
            table = m.block_table(rid, group)
            pages |= set(table[table != STALE].tolist())
    return len(pages)


def tables(pools: BallastPools, rids: list[int]) -> list[list[int]]:
    return [pools.manager.block_table(r, g).tolist() for r in rids for g in (pools.sliding, pools.full)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 3999)), max_size=12),
    st.lists(st.floats(0.03, 0.97), min_size=1, max_size=6),
)
def test_moves_never_touch_live_pages_nor_exceed_the_budget(
    requests: list[tuple[int, int]], shares: list[float]
) -> None:
    plan = small_plan()
    pools = BallastPools.build(plan, low=0.02, high=0.98, enable_reuse=False)
    m = pools.manager
    assert pools.bytes_now() <= plan.budget_bytes
    assert pools.sizes() == {g.name: g.pages for g in plan.groups}  # starts at the plan's split
    pad = m.reserve_padding_dummy()
    assert pad is not None
    rids = [pad]
    for i, (cap, hist) in enumerate(requests):
        m.create(i)
        if m.resize(i, cap, min(hist, cap)):
            rids.append(i)
        else:
            m.free(i)
    for share in shares:
        before = tables(pools, rids)
        sizes = pools.sizes()
        free = {g: m.free_pages(g) for g in sizes}
        target = pages_for_share(plan, pools.sliding, share)
        moved, reached = pools.set_sizes(target)
        assert tables(pools, rids) == before  # no request lost, gained or moved a page
        assert pools.bytes_now() <= plan.budget_bytes
        for g in sizes:
            assert pools.size(g) >= live_outside_ballast(pools, g)
            assert moved[g] == pools.size(g) - sizes[g]
            assert -moved[g] <= max(free[g], 0) or moved[g] >= 0  # a pool gives up only free pages
        if reached:  # nothing held it back: the ballast covers the target (sizes at or just under it)
            assert all(pools.size(g) <= target[g] for g in sizes)
        m.check_integrity()


def test_a_full_pool_drains_into_the_other_instead_of_preempting() -> None:
    """All sliding pages in use: a move to a smaller sliding share moves
    nothing now and finishes once the request that held them is freed."""
    plan = small_plan(kv_gib=2.0)
    pools = BallastPools.build(plan, low=0.02, high=0.98, enable_reuse=False)
    m = pools.manager
    rid = 0
    while True:  # fill the sliding pool with prefills (which hold every page)
        m.create(rid)
        if not m.resize(rid, 256, 0):
            m.free(rid)
            break
        rid += 1
    target = pages_for_share(plan, pools.sliding, 0.3)
    assert m.free_pages(pools.sliding) < 8 < m.free_pages(pools.full)  # the sliding pool is the full one
    free = m.free_pages(pools.sliding)
    moved, reached = pools.set_sizes(target)
    assert not reached and -free <= moved[pools.sliding] <= 0
    for r in range(rid):
        m.free(r)
    moved, reached = pools.set_sizes(target)
    assert reached and moved[pools.sliding] < 0 < moved[pools.full]
    assert pools.bytes_now() <= plan.budget_bytes


def test_models_without_one_sliding_and_one_full_group_are_refused() -> None:
    spec = load_model_spec("qwen3-0.6b", max_seq_len=4096)
    with pytest.raises(RebalanceError, match="one sliding and one full"):
        plan_for(spec, ServingLimits(max_seq_len=4096), "rebalance", kv_memory_bytes=2**30)


def test_dry_run_changes_nothing_and_reports_its_moves() -> None:
    rng = np.random.default_rng(3)
    n = 60  # short chat, then long prompts: the EMA wants a different split
    prompts = np.concatenate([rng.integers(100, 600, n // 2), rng.integers(2500, 3500, n // 2)])
    trace = Trace("shift", prompts, rng.integers(20, 80, n), np.zeros(n))
    plan = small_plan(kv_gib=1.0)
    limits, _, model, _, _ = shifting_case()
    seen: list[dict[str, int]] = []
    dry, log = simulate_rebalanced(plan, trace, model, dry_run=True, on_step=lambda p: seen.append(p.sizes()))
    static = simulate(plan, trace, model, fast=False)
    assert {tuple(sorted(s.items())) for s in seen} == {
        tuple((g.name, g.pages) for g in sorted(plan.groups, key=lambda g: g.name))
    }
    assert log.moves and not any(m.applied for m in log.moves)
    last = pages_for_share(plan, "sliding", log.moves[-1].target)  # each move is counted from the one before
    assert all(sum(m.moved[g.name] for m in log.moves) == last[g.name] - g.pages for g in plan.groups)
    assert (dry.output_tokens, dry.preemptions, dry.steps) == (static.output_tokens, static.preemptions, static.steps)
    assert dry.makespan_s == pytest.approx(static.makespan_s, rel=1e-9)


@pytest.mark.slow  # a study: a whole static sweep beside the online run
def test_rebalance_beats_every_split_of_a_static_sweep_on_a_shifting_trace() -> None:
    limits, trace, model, spec, kv = shifting_case()
    static: dict[float | str, float] = {}
    for share in (0.2, 0.35, 0.5, 0.65, 0.8, 0.95):
        plan = plan_for(spec, limits, ratio_policy("sliding", share), kv_memory_bytes=kv).plan
        static[share] = simulate(plan, trace, model).output_tokens_per_s
    start = plan_for(spec, limits, "rebalance", kv_memory_bytes=kv).plan
    static["reference"] = simulate(start, trace, model).output_tokens_per_s
    checks: list[bool] = []

    def invariants(pools: BallastPools) -> None:
        checks.append(
            pools.bytes_now() <= start.budget_bytes
            and all(pools.size(g) >= live_outside_ballast(pools, g) for g in pools.totals)
        )

    result, log = simulate_rebalanced(start, trace, model, on_step=invariants)
    assert checks and all(checks)
    assert result.finished + result.rejected == len(trace)
    moved = log.moved_pages()
    assert len(log.moves) >= 2 and moved["sliding"] > 0 and moved["full"] > 0
    # the chat half wants more sliding pages than the long-prompt half
    assert max(m.share_to for m in log.moves) > log.moves[-1].share_to
    assert result.output_tokens_per_s > max(static.values()), (result.output_tokens_per_s, static)
    assert math.isfinite(result.output_tokens_per_s)


def test_rebalancer_settings_are_checked() -> None:
    plan = small_plan()
    for bad in ({"alpha": 0.0}, {"band": 1.0}, {"low": 0.5, "high": 0.4}, {"check_every": 0}):
        with pytest.raises(RebalanceError):
            Rebalancer(plan, **bad)  # type: ignore[arg-type]
