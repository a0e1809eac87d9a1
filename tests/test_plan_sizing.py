"""plan_pools end to end: the Gemma 4 case, the profile phase, infeasible
budgets and --fit, and the budget invariant on random inputs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import InfeasiblePlanError, KvpoolError
from kvpool.plan import (
    ServingLimits,
    plan_constraints,
    plan_pools,
    rules_for,
)
from kvpool.plan.feasibility import floors_fit
from kvpool.spec import LayerGroup, ModelSpec, Shape, load_model_spec
from plan_helpers import assert_holds, assert_within_budget, group, model

GiB = 2**30

# --------------------------------------------------------------------------- Gemma 4

GEMMA_LIMITS = {"max_batch_size": 256, "max_seq_len": 32768, "max_num_tokens": 8192}
# gemma-4-26b-a4b, FP8 KV, 32-token pages: 25 sliding layers x 2 (K, V) x 8 heads
# x 256 dims x 1 byte = 102,400 B per position -> 3,276,800 B per page; 5 global
# layers x 2 x 2 heads x 512 dims = 10,240 B per position -> 327,680 B per page.
SLIDING_PAGE, FULL_PAGE = 3_276_800, 327_680
# Worst-case live sliding pages of one decode: ceil((1024 + 1 - 1)/32) + 1 = 33.
WINDOW_DECODE_PAGES = 33


def gemma() -> tuple[ModelSpec]:
    spec = load_model_spec("gemma-4-26b-a4b", kv_dtype="fp8")
    assert spec.group("sliding").page_bytes == SLIDING_PAGE
    assert spec.group("full").page_bytes == FULL_PAGE
    return (spec,)


def test_gemma4_default_plan_holds_more_full_window_decodes_than_b() -> None:
    (spec,) = gemma()
    plan = plan_pools(spec, ServingLimits(**GEMMA_LIMITS), kv_memory_bytes=60 * GiB)  # type: ignore[arg-type]
    assert_within_budget(plan)
    # Reference ratio: full 65 pages x 327,680 = 21,299,200 B; sliding 33 pages x
    # 3,276,800 = 108,134,400 B. Sliding pages = floor(60 GiB x its share / page).
    budget = 60 * GiB
    sliding = budget * 108_134_400 // (108_134_400 + 21_299_200) // SLIDING_PAGE
    assert plan.pages("sliding") in (sliding, sliding + 1)
    assert plan.pages("sliding") // WINDOW_DECODE_PAGES > 256
    assert plan.warnings == ()


def test_gemma4_forcing_s_equal_l_starves_the_sliding_pool_and_warns() -> None:
    (spec,) = gemma()
    limits = ServingLimits(**GEMMA_LIMITS, avg_seq_len=32768)  # type: ignore[arg-type]
    plan = plan_pools(spec, limits, kv_memory_bytes=60 * GiB)
    assert_within_budget(plan)
    # Typical step: context (8192, 0) + 255 decodes (32768, 32767).
    # full: 8192/32 = 256 + 255 x 32768/32 = 255 x 1024 -> 261,376 pages;
    # sliding: 256 + 255 x (1024 - floor((32767 + 1 - 1024)/32) = 1024 - 992 = 32) -> 8,416.
    full_bytes, sliding_bytes = 261_376 * FULL_PAGE, 8_416 * SLIDING_PAGE
    assert plan.ratio["full"] == pytest.approx(full_bytes / (full_bytes + sliding_bytes))
    assert plan.group("full").share > 0.7  # the reference plan gives it < 0.2
    window_decodes = plan.pages("sliding") // WINDOW_DECODE_PAGES
    assert window_decodes < 0.6 * 256, window_decodes
    assert any("'sliding'" in w and "256" in w and "eager" in w for w in plan.warnings), plan.warnings


# --------------------------------------------------------------------------- infeasible


def toy_v4() -> object:
    """A DeepSeek-V4-like toy: 128-position pages of 128 B in a sliding(128) and a
    ratio-4 compressed group, and 1000 B of state per request."""
    return model(
        group("sliding", "sliding", row_bytes=1, tpb=128, window=128),
        group("compressed4", "compressed", row_bytes=4, tpb=128, ratio=4),
        group("state", "state", tpb=128, state_bytes=1000),
        family="deepseek_v4",
    )


TOY_LIMITS = ServingLimits(max_batch_size=8, max_seq_len=4096, max_num_tokens=None)


def test_infeasible_plan_names_constraint_group_shortfall_and_what_fits() -> None:
    spec = toy_v4()
    # Longest decode (4096, 4095) + 7 x (1, 0):
    #   sliding: 32 - floor((4095 + 1 - 128)/128) = 32 - 31 = 1, plus 7 -> 8 pages = 1,024 B
    #   compressed4: 4096/128 = 32, plus 7 -> 39 pages = 4,992 B
    #   state: 8 requests x 1,000 B = 8,000 B            total 14,016 B
    # Budget 10,500: 3,516 B short. The state group grows most (7 x 1000 B):
    # ceil(3516 / 1000) = 4 pages short.
    # Largest B at L = 4096: 128b + 128(31 + b) + 1000b <= 10500 -> b <= 5.
    # Largest L at B = 8: state 8,000 B, compressed 7 + ceil(L/128) pages, sliding
    # 7 + live(L, L - 1) where live = 1 at multiples of 128 and 2 just past one:
    #   L = 512: 8,000 + 8 x 128 + 11 x 128 = 10,432 fits;
    #   L = 385..511: 8,000 + 9 x 128 + 11 x 128 = 10,560 does not (not monotone!);
    #   L = 513..640: at least 8,000 + 8 x 128 + 12 x 128 = 10,560 does not.
    with pytest.raises(InfeasiblePlanError) as info:
        plan_pools(spec, TOY_LIMITS, kv_memory_bytes=10_500)  # type: ignore[arg-type]
    e = info.value
    assert (e.constraint, e.group, e.short_pages, e.max_batch_size, e.max_seq_len) == (
        "longest_decode",
        "state",
        4,
        5,
        512,
    ), str(e)
    assert "\n" not in str(e) and "'state'" in str(e)


def test_fit_shrinks_the_longest_request_capacity_and_history_together() -> None:
    spec = toy_v4()
    plan = plan_pools(spec, TOY_LIMITS, kv_memory_bytes=10_500, fit=True)  # type: ignore[arg-type]
    assert_within_budget(plan)
    (c,) = plan.constraints
    # The longest request keeps its gap of 1 and shrinks to the 512 found above.
    assert c.shrunk_from == Shape(4096, 4095)
    assert c.batch == (Shape(512, 511),) + (Shape(1, 0),) * 7
    assert_holds(plan, c.batch)
    assert any("4096" in w and "512" in w for w in plan.warnings), plan.warnings


def test_fit_fails_when_even_the_smallest_request_does_not_fit() -> None:
    # 8 state slots alone need 8,000 B.
    with pytest.raises(InfeasiblePlanError, match="state"):
        plan_pools(toy_v4(), TOY_LIMITS, kv_memory_bytes=8_500, fit=True)  # type: ignore[arg-type]


def test_budget_below_one_page_per_group_is_infeasible() -> None:
    with pytest.raises(InfeasiblePlanError) as info:
        plan_pools(toy_v4(), TOY_LIMITS, kv_memory_bytes=1_000)  # type: ignore[arg-type]
    assert info.value.constraint == "one_page_per_group"


def test_bad_budget_and_phase_are_user_errors() -> None:
    for kw in ({"kv_memory_bytes": 0}, {"kv_memory_bytes": 10**9, "phase": "warm"}):
        with pytest.raises(KvpoolError):
            plan_pools(toy_v4(), TOY_LIMITS, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- invariants


@st.composite
def specs(draw: st.DrawFn) -> object:
    tpb = draw(st.sampled_from([4, 16, 32, 64]))
    kinds = draw(
        st.lists(st.sampled_from(["full", "sliding", "chunked", "compressed", "state"]), min_size=1, max_size=4)
    )
    groups: list[LayerGroup] = []
    for i, kind in enumerate(kinds):
        row = draw(st.integers(1, 4096))
        if kind == "state":
            groups.append(group(f"g{i}", "state", tpb=tpb, state_bytes=draw(st.integers(1, 10**6))))
        elif kind in ("sliding", "chunked"):
            groups.append(group(f"g{i}", kind, tpb=tpb, row_bytes=row, window=draw(st.integers(1, 4096))))
        elif kind == "compressed":
            groups.append(
                group(
                    f"g{i}",
                    kind,
                    tpb=tpb,
                    row_bytes=row,
                    ratio=draw(st.sampled_from([r for r in (1, 2, 4) if tpb % r == 0])),
                )
            )
        else:
            groups.append(group(f"g{i}", kind, tpb=tpb, row_bytes=row))
    return model(*groups, family=draw(st.sampled_from(["attention", "deepseek_v4"])))


@st.composite
def limits_st(draw: st.DrawFn) -> ServingLimits:
    seq = draw(st.integers(1, 16384))
    b = draw(st.integers(1, 300))
    return ServingLimits(
        max_batch_size=b,
        max_seq_len=seq,
        max_num_tokens=draw(st.one_of(st.none(), st.integers(1, 16384))),
        max_draft_len=draw(st.integers(0, 4)),
        num_extra_kv_tokens=draw(st.integers(0, 4)),
        avg_seq_len=draw(st.one_of(st.none(), st.integers(1, seq))),
    )


# Log-uniform budgets from 4 KiB to 64 GiB: most are feasible, many are tight.
budgets = st.floats(12, 36).map(lambda e: int(2**e))


@settings(max_examples=150, deadline=None)
@given(
    spec=specs(),
    limits=limits_st(),
    budget=budgets,
    phase=st.sampled_from(["final", "profile"]),
    fit=st.booleans(),
    explicit=st.booleans(),
)
def test_total_never_exceeds_budget_and_floors_hold_or_infeasible(
    spec: ModelSpec, limits: ServingLimits, budget: int, phase: Any, fit: bool, explicit: bool
) -> None:
    names = spec.group_names
    ratio = {n: 1 / len(names) for n in names} if explicit else None
    try:
        plan = plan_pools(
            spec,
            limits,
            kv_memory_bytes=budget,
            pool_ratio=ratio,  # type: ignore[arg-type]
            fit=fit,
            phase=phase,
        )  # type: ignore[arg-type]
    except InfeasiblePlanError:
        if not fit:
            wanted = plan_constraints(
                limits,
                rules_for(spec),
                phase,  # type: ignore[arg-type]
                explicit_ratio=explicit and phase == "final",
            )
            assert not floors_fit(spec, wanted, budget)  # type: ignore[arg-type]
        return
    assert_within_budget(plan)
    assert all(g.pages >= 1 for g in plan.groups)
    for c in plan.constraints:
        assert c.satisfied
        assert_holds(plan, c.batch, c.name)
        if not fit:
            assert c.shrunk_from is None
