"""Feasibility answers are exact: the largest B, L and shrunk length that fit
are checked against a brute-force scan of every candidate."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import InfeasiblePlanError
from kvpool.plan import ServingLimits, plan_constraints, plan_guarantees, plan_pools, rules_for
from kvpool.plan.families import longest_decode_batch
from kvpool.plan.feasibility import (
    base_floors,
    batch_floors,
    floors_fit,
    largest_fitting,
    largest_fitting_length,
    merge_floors,
    pages_bytes,
)
from kvpool.spec import ModelSpec, load_model_spec
from plan_helpers import group, model


def test_largest_fitting_bisects_a_monotone_predicate() -> None:
    assert largest_fitting(1, 100, lambda x: x <= 37) == 37
    assert largest_fitting(1, 100, lambda x: False) == 0
    assert largest_fitting(1, 100, lambda x: True) == 100
    assert largest_fitting(5, 4, lambda x: True) == 4  # empty range


def test_largest_fitting_length_finds_a_page_boundary_past_a_gap() -> None:
    # Fits at 384, not at 385..511, again at 512, never after (tpb 128): the
    # shape a sliding group's page count takes; plain bisection returns 384.
    def fits(x: int) -> bool:
        return x <= 384 or x == 512

    assert largest_fitting(1, 4096, fits) == 384
    assert largest_fitting_length(1, 4096, 128, fits) == 512
    assert largest_fitting_length(1, 100, 128, fits) == 100
    assert largest_fitting_length(1, 4096, 128, lambda x: False) == 0


@st.composite
def v4_toys(draw: st.DrawFn) -> ModelSpec:
    """Small DeepSeek-V4-family specs (they carry the L- and B-dependent floor)."""
    tpb = draw(st.sampled_from([4, 8, 16]))
    groups = [group("sliding", "sliding", tpb=tpb, row_bytes=draw(st.integers(1, 64)), window=draw(st.integers(1, 64)))]
    if draw(st.booleans()):
        groups.append(
            group(
                "compressed",
                "compressed",
                tpb=tpb,
                row_bytes=draw(st.integers(1, 64)),
                ratio=draw(st.sampled_from([1, 2, 4])),
            )
        )
    if draw(st.booleans()):
        groups.append(group("full", tpb=tpb, row_bytes=draw(st.integers(1, 64))))
    if draw(st.booleans()):
        groups.append(group("state", "state", tpb=tpb, state_bytes=draw(st.integers(1, 300))))
    return model(*groups, family="deepseek_v4")


def fits_at(spec: ModelSpec, limits: ServingLimits, budget: int) -> bool:
    """Whether a plan at `limits` holds every constraint and guarantee (what the
    errors' suggestions promise), from the floors by brute force."""
    wanted = plan_constraints(limits, rules_for(spec), "final", explicit_ratio=False)
    return floors_fit(spec, wanted + plan_guarantees(limits, "final"), budget)


def budget_near_floors(spec: ModelSpec, limits: ServingLimits, frac: float) -> int:
    """One page per group plus `frac` of the rest of what the floors need: tight on purpose."""
    base = pages_bytes(spec, base_floors(spec))
    need = merge_floors(base_floors(spec), batch_floors(spec, longest_decode_batch(limits, limits.max_batch_size)))
    return base + int(frac * (pages_bytes(spec, need) - base))


@settings(max_examples=60, deadline=None)
@given(spec=v4_toys(), seq=st.integers(2, 600), b=st.integers(1, 12), d=st.integers(0, 2), frac=st.floats(0.05, 1.2))
def test_infeasible_error_reports_the_exact_largest_b_and_l(
    spec: ModelSpec, seq: int, b: int, d: int, frac: float
) -> None:
    limits = ServingLimits(max_batch_size=b, max_seq_len=seq, max_num_tokens=None, max_draft_len=d)
    budget = budget_near_floors(spec, limits, frac)
    try:
        plan_pools(spec, limits, kv_memory_bytes=budget)
    except InfeasiblePlanError as e:
        if e.constraint == "one_page_per_group":
            return
        ok_l = [n for n in range(1, seq + 1) if fits_at(spec, limits.clamped(max_seq_len=n), budget)]
        ok_b = [k for k in range(1, b + 1) if fits_at(spec, limits.clamped(max_batch_size=k), budget)]
        assert e.max_seq_len == max(ok_l, default=0), str(e)
        assert e.max_batch_size == max(ok_b, default=0), str(e)
        assert e.short_pages >= 1


@settings(max_examples=60, deadline=None)
@given(spec=v4_toys(), seq=st.integers(2, 600), b=st.integers(1, 12), d=st.integers(0, 2), frac=st.floats(0.05, 1.2))
def test_fit_shrinks_to_the_exact_longest_length_that_fits(
    spec: ModelSpec, seq: int, b: int, d: int, frac: float
) -> None:
    limits = ServingLimits(max_batch_size=b, max_seq_len=seq, max_num_tokens=None, max_draft_len=d)
    budget = budget_near_floors(spec, limits, frac)
    try:
        plan = plan_pools(spec, limits, kv_memory_bytes=budget, fit=True)
    except InfeasiblePlanError:
        # Even the shortest decode (capacity 1, history 0) does not fit.
        assert not fits_at(spec, limits.clamped(max_seq_len=1), budget)
        return
    (c,) = plan.constraints
    # the longest decode is the warmup dummy of L tokens: capacity L + d, history L - 1
    got = c.batch[0].capacity - d
    if c.shrunk_from is None:
        assert got == seq
        return
    assert c.shrunk_from == (seq + d, seq - 1) and c.batch[0] == (got + d, got - 1)
    assert fits_at(spec, limits.clamped(max_seq_len=got), budget)
    longer = [n for n in range(got + 1, seq + 1) if fits_at(spec, limits.clamped(max_seq_len=n), budget)]
    assert not longer, f"shrunk to {got} but {longer[:5]} also fit"


def test_context_constraint_error_names_the_largest_token_budget_and_never_offers_fit() -> None:
    # qwen3-8b, bf16, 32-token pages: 36 x 2 x 8 x 128 x 2 B x 32 = 4.5 MiB a page, so
    # 100 MiB hold 22 pages = 704 positions. The context floor is the engine's context
    # warmup [(N + 1, 0)] (N prompt tokens and the first generated token), so it fits
    # up to N = 703; one request at L = 512 needs 16 pages, 8 minimal decodes 8.
    # Its gap (capacity - history) is its whole capacity, so --fit cannot shrink it.
    spec = load_model_spec("qwen3-8b")
    limits = ServingLimits(max_batch_size=8, max_seq_len=512, max_num_tokens=8192, avg_seq_len=256)
    for fit in (False, True):
        with pytest.raises(InfeasiblePlanError) as e:
            plan_pools(spec, limits, kv_memory_bytes=100 * 2**20, fit=fit)
        assert e.value.constraint == "context" and e.value.max_num_tokens == 703, str(e.value)
        assert "--fit" not in str(e.value)
    plan = plan_pools(spec, dataclasses.replace(limits, max_num_tokens=703), kv_memory_bytes=100 * 2**20)
    assert all(c.satisfied for c in plan.guarantees) and plan.warnings == ()
    with pytest.raises(InfeasiblePlanError):
        plan_pools(spec, dataclasses.replace(limits, max_num_tokens=704), kv_memory_bytes=100 * 2**20)
    # At L = 4096 (128 pages) no token budget makes the plan hold a request of max_seq_len:
    # the error suggests none, and the budget that would (the 257 pages of N = 8192 + 1
    # are the largest floor: 257 x 4.5 MiB = 1156.5 MiB, whole MiB up)
    with pytest.raises(InfeasiblePlanError) as e:
        plan_pools(spec, dataclasses.replace(limits, max_seq_len=4096), kv_memory_bytes=100 * 2**20)
    assert e.value.max_num_tokens == 0 and e.value.kv_memory_bytes == 1157 * 2**20, str(e.value)


def test_fit_is_offered_where_shrinking_the_longest_request_helps() -> None:
    spec = load_model_spec("deepseek-v4-flash", kv_dtype="fp8")
    limits = ServingLimits(max_batch_size=16, max_seq_len=1 << 20)
    with pytest.raises(InfeasiblePlanError) as e:
        plan_pools(spec, limits, kv_memory_bytes=2 * 2**30)
    assert e.value.constraint == "longest_decode" and "--fit" in str(e.value)
    plan = plan_pools(spec, limits, kv_memory_bytes=2 * 2**30, fit=True)
    assert plan.total_bytes <= 2 * 2**30
