"""Guarantees and advice (docs/plan.md, "Guarantees" and "When the floors do not
fit"): a final plan holds the engine's warmup shapes and one request at
max_seq_len whenever its budget can, says first what it misses and the smallest
change that would hold it, and every length, batch, token budget, KV budget or
split that an error or a warning suggests plans without a would-fail warning."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import InfeasiblePlanError
from kvpool.plan import (
    PoolPlan,
    ServingLimits,
    plan_constraints,
    plan_guarantees,
    plan_pools,
    rules_for,
)
from kvpool.plan.batches import decode_shape
from kvpool.plan.feasibility import floors_fit
from kvpool.plan.report import plan_warnings
from kvpool.spec import ModelSpec, load_model_spec
from plan_helpers import assert_holds, assert_within_budget, group, model

GiB, MiB = 2**30, 2**20


def would_fail(plan: PoolPlan) -> list[str]:
    """The warnings that mean the engine fails to start or a max-length request can
    never run, from the warmup dry run and the concurrency count (not from the
    plan's own guarantee results)."""
    return [w for w in plan_warnings(plan) if "would fail" in w or "not even one request" in w]


# ----------------------------------------------------------------- the Gemma 3 case


def test_gemma3_at_71k_on_one_h100_holds_a_max_length_request(cli: Any) -> None:
    """The reference split of gemma-3-27b's whole-H100 budget gives the full pool fewer
    pages of 32 tokens than one request of 72,704 tokens takes (2,272): now that request
    is a floor, the ratio stays the reference one and the sliding pool gives up the bytes.
    (At 65,536 tokens the budget before it followed vLLM's formula was 47 pages short;
    docs/plan.md.)"""
    args = ["plan", "gemma-3-27b", "--gpu", "h100", "--max-seq-len", "72704"]
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    plan = json.loads(out)
    pages = {g["name"]: g["pages"] for g in plan["groups"]}
    assert plan["policy"] == "reference" and pages["full"] == 72704 // 32 == 2272
    assert plan["max_concurrency"]["max_seq_len"] == 1
    assert plan["total_bytes"] <= plan["budget_bytes"]
    assert not [w for w in plan["warnings"] if "max_seq_len" in w or "would fail" in w]
    assert any("guarantee max_seq_len holds group 'full' at 2,272 pages" in n for n in plan["notes"]), plan["notes"]
    # the same ratio without the floor (an explicit ratio opts out) is the old split: the full
    # pool's share of the budget in whole pages, short of the request
    shares = reference_shares(plan)
    ratio = ",".join(f"{g}={s!r}" for g, s in shares.items())
    code, out, err = cli(*args, "--pool-ratio", ratio, "--json")
    old = {g["name"]: g["pages"] for g in json.loads(out)["groups"]}
    page = load_model_spec("gemma-3-27b", max_seq_len=72704).group("full").slot_bytes
    assert old["full"] == int(plan["budget_bytes"] * shares["full"] // page) < pages["full"], old


def reference_shares(plan: dict[str, Any]) -> dict[str, float]:
    # the reference request (2049, 2048): full 65 pages, sliding 65 - 32 = 33 pages
    spec = load_model_spec("gemma-3-27b", max_seq_len=72704)
    raw = {"full": 65 * spec.group("full").slot_bytes, "sliding": 33 * spec.group("sliding").slot_bytes}
    return {k: v / sum(raw.values()) for k, v in raw.items()}


def test_gemma3_at_64k_with_avg_seq_len_holds_the_engines_context_warmup(cli: Any) -> None:
    """With S = L the context floor was N + E = 8,192 positions, one sliding page short
    of the engine's context warmup (N + 1 = 8,193 positions: 257 pages)."""
    code, out, err = cli(
        "plan", "gemma-3-27b", "--gpu", "h100", "--max-seq-len", "65536", "--avg-seq-len", "65536", "--json"
    )
    assert code == 0, err
    plan = json.loads(out)
    assert {g["name"]: g["pages"] for g in plan["groups"]}["sliding"] >= -(-8193 // 32) == 257
    assert not [w for w in plan["warnings"] if "would fail" in w or "cannot hold" in w], plan["warnings"]


# ----------------------------------------------------------------- make demo's pair


DEMO = ["plan", "deepseek-v4-flash", "--kv-dtype", "fp8", "--kv-memory", "2GiB", "--max-batch-size", "16"]


def test_the_length_the_demo_error_suggests_plans_without_a_warning(cli: Any) -> None:
    """It suggested 509,952, and planning 509,952 warned that the engine's context warmup
    was one sliding page short: the suggestion was searched on floors that lacked the
    warmup's first generated token."""
    code, out, err = cli(*DEMO, "--max-seq-len", "1048576")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    length = int(err.split("largest max_seq_len that fits: ")[1].split(";")[0])
    memory = err.split("a KV budget that fits: ")[1].split(";")[0]
    assert length < 509952
    for argv in ([*DEMO, "--max-seq-len", str(length)], [*DEMO, "--max-seq-len", "1048576", "--kv-memory", memory]):
        code, out, err = cli(*argv, "--json")
        assert code == 0, err
        plan = json.loads(out)
        assert plan["max_concurrency"]["max_seq_len"] >= 1
        assert not [w for w in plan["warnings"] if "would fail" in w or "cannot hold" in w], plan["warnings"]
    # one position more does not fit: the suggestion is the largest
    code, _, err = cli(*DEMO, "--max-seq-len", str(length + 1))
    assert code == 2 and "longest_decode" in err


# ----------------------------------------------------------------- random models


@st.composite
def specs(draw: st.DrawFn) -> ModelSpec:
    """Small specs of every kind but chunked (whose page need falls at a chunk's end,
    so no largest length exists to check against), generic or DeepSeek-V4."""
    tpb = draw(st.sampled_from([4, 8, 16]))
    groups = []
    for i, kind in enumerate(draw(st.lists(st.sampled_from(["full", "sliding", "compressed", "state"]), max_size=3))):
        if kind == "state":
            groups.append(group(f"g{i}", "state", tpb=tpb, state_bytes=draw(st.integers(1, 400))))
        elif kind == "sliding":
            groups.append(
                group(f"g{i}", kind, tpb=tpb, row_bytes=draw(st.integers(1, 64)), window=draw(st.integers(1, 80)))
            )
        elif kind == "compressed":
            ratio = draw(st.sampled_from([r for r in (1, 2, 4) if tpb % r == 0]))
            groups.append(group(f"g{i}", kind, tpb=tpb, row_bytes=draw(st.integers(1, 64)), ratio=ratio))
        else:
            groups.append(group(f"g{i}", tpb=tpb, row_bytes=draw(st.integers(1, 64))))
    groups.append(group("full", tpb=tpb, row_bytes=draw(st.integers(1, 64))))
    return model(*groups, family=draw(st.sampled_from(["attention", "deepseek_v4"])))


@st.composite
def limits_st(draw: st.DrawFn) -> ServingLimits:
    seq = draw(st.integers(1, 600))
    return ServingLimits(
        max_batch_size=draw(st.integers(1, 24)),
        max_seq_len=seq,
        max_num_tokens=draw(st.one_of(st.none(), st.integers(1, 400))),
        max_draft_len=draw(st.integers(0, 3)),
        num_extra_kv_tokens=draw(st.integers(0, 2)),
        avg_seq_len=draw(st.one_of(st.none(), st.integers(1, seq))),
    )


budgets = st.floats(6, 17).map(lambda e: int(2**e))  # 64 B to 128 KiB: most plans are tight


def every_floor(spec: ModelSpec, limits: ServingLimits) -> tuple[Any, ...]:
    return plan_constraints(limits, rules_for(spec), "final", explicit_ratio=False) + plan_guarantees(limits, "final")


@settings(max_examples=120, deadline=None)
@given(spec=specs(), limits=limits_st(), budget=budgets)
def test_a_plan_holds_every_guarantee_whenever_its_budget_can(
    spec: ModelSpec, limits: ServingLimits, budget: int
) -> None:
    try:
        plan = plan_pools(spec, limits, kv_memory_bytes=budget)
    except InfeasiblePlanError:
        return
    assert_within_budget(plan)
    for c in plan.guarantees:
        if c.satisfied:
            assert_holds(plan, c.batch, c.name)
    if floors_fit(spec, every_floor(spec, limits), budget):
        assert all(c.satisfied for c in plan.guarantees), plan.guarantees
        assert not would_fail(plan), plan.warnings
        assert plan.max_requests(decode_shape(limits.max_seq_len, limits)) >= 1
    else:
        assert any(not c.satisfied for c in plan.guarantees)
        assert "cannot hold" in plan.warnings[0] and would_fail(plan)


def suggestions(
    spec: ModelSpec, limits: ServingLimits, budget: int, ratio: Any
) -> list[tuple[ServingLimits, int, Any]]:
    """Every (limits, budget, pool ratio) that the error or the plan's first warning
    suggests; [] when the plan holds everything. Checks that a suggestion is made
    wherever the budget alone would do (there is always one)."""
    try:
        plan = plan_pools(spec, limits, kv_memory_bytes=budget, pool_ratio=ratio)
    except InfeasiblePlanError as e:
        if e.constraint == "one_page_per_group":
            return []
        assert e.kv_memory_bytes > budget, str(e)
        found = [(limits, e.kv_memory_bytes, ratio)]
        if e.max_seq_len:
            found.append((limits.clamped(max_seq_len=e.max_seq_len), budget, ratio))
        if e.max_batch_size:
            found.append((limits.clamped(max_batch_size=e.max_batch_size), budget, ratio))
        if e.max_num_tokens:
            found.append((dataclasses.replace(limits, max_num_tokens=e.max_num_tokens), budget, ratio))
        return found
    if all(c.satisfied for c in plan.guarantees):
        return []
    a = plan.advice
    assert a is not None and a.kv_memory_bytes > budget, plan.warnings
    assert f"{a.kv_memory_bytes // MiB}MiB" in plan.warnings[0]
    found = [(limits, a.kv_memory_bytes, ratio)]
    if a.max_seq_len:
        assert f"max_seq_len {a.max_seq_len}" in plan.warnings[0]
        found.append((limits.clamped(max_seq_len=a.max_seq_len), budget, ratio))
    if a.max_batch_size:
        found.append((limits.clamped(max_batch_size=a.max_batch_size), budget, ratio))
    if a.max_num_tokens:
        found.append((dataclasses.replace(limits, max_num_tokens=a.max_num_tokens), budget, ratio))
    if a.pool_ratio is not None:
        found.append((limits, budget, dict(a.pool_ratio)))
    return found


@settings(max_examples=150, deadline=None)
@given(spec=specs(), limits=limits_st(), budget=budgets, explicit=st.booleans())
def test_every_suggestion_plans_without_a_would_fail_warning(
    spec: ModelSpec, limits: ServingLimits, budget: int, explicit: bool
) -> None:
    ratio = {n: 1 / len(spec.groups) for n in spec.group_names} if explicit else None
    for lim, kv, r in suggestions(spec, limits, budget, ratio):
        plan = plan_pools(spec, lim, kv_memory_bytes=kv, pool_ratio=r)
        assert all(c.satisfied for c in plan.guarantees), (lim, kv, r, plan.guarantees)
        assert not would_fail(plan), (lim, kv, r, plan.warnings)


@settings(max_examples=100, deadline=None)
@given(spec=specs(), limits=limits_st(), budget=budgets, explicit=st.booleans())
def test_fit_takes_the_split_or_the_length_and_then_holds_everything(
    spec: ModelSpec, limits: ServingLimits, budget: int, explicit: bool
) -> None:
    ratio = {n: 1 / len(spec.groups) for n in spec.group_names} if explicit else None
    try:
        plan = plan_pools(spec, limits, kv_memory_bytes=budget, pool_ratio=ratio, fit=True)
    except InfeasiblePlanError as e:
        # no split and no shorter max_seq_len would: the length search agrees
        if e.constraint != "one_page_per_group":
            assert e.max_seq_len == 0, str(e)
        return
    assert_within_budget(plan)
    assert all(c.satisfied for c in plan.guarantees) and not would_fail(plan), plan.warnings
    assert plan.limits.max_seq_len <= limits.max_seq_len
    if plan.limits.max_seq_len < limits.max_seq_len:
        assert any(f"lowered from {limits.max_seq_len} to {plan.limits.max_seq_len}" in w for w in plan.warnings)


@settings(max_examples=100, deadline=None)
@given(spec=specs(), limits=limits_st(), budget=budgets)
def test_the_suggested_length_is_the_largest_that_holds_everything(
    spec: ModelSpec, limits: ServingLimits, budget: int
) -> None:
    try:
        plan = plan_pools(spec, limits, kv_memory_bytes=budget)
        if plan.advice is None:
            return
        got = plan.advice.max_seq_len
    except InfeasiblePlanError as e:
        if e.constraint == "one_page_per_group":
            return
        got = e.max_seq_len
    holds = [
        n
        for n in range(1, limits.max_seq_len)
        if floors_fit(spec, every_floor(spec, limits.clamped(max_seq_len=n)), budget)
    ]
    assert got == max(holds, default=0)


def test_an_explicit_ratio_is_kept_and_the_split_that_would_hold_is_named() -> None:
    # a full + sliding(1024) toy, equal rows: a request at L = 4096 needs 128 full pages;
    # 10% of a 1024-page budget gives the full group 102
    spec = model(group("full", row_bytes=1, tpb=32), group("sliding", "sliding", row_bytes=1, tpb=32, window=1024))
    limits = ServingLimits(max_batch_size=8, max_seq_len=4096, max_num_tokens=512)
    budget = 1024 * 32
    plan = plan_pools(spec, limits, kv_memory_bytes=budget, pool_ratio={"full": 0.1, "sliding": 0.9})
    assert plan.pages("full") == 102 and plan.policy == "pool_ratio"
    (missed,) = [c for c in plan.guarantees if not c.satisfied]
    assert missed.name == "max_seq_len" and dict(missed.short) == {"full": 128 - 102}
    assert plan.advice is not None and plan.advice.pool_ratio is not None
    assert plan.advice.pool_ratio["full"] >= 128 / 1024
    assert "--pool-ratio" in plan.warnings[0] and "(--fit takes it)" in plan.warnings[0]
    fitted = plan_pools(spec, limits, kv_memory_bytes=budget, pool_ratio={"full": 0.1, "sliding": 0.9}, fit=True)
    assert fitted.pages("full") == 128 and fitted.limits == limits  # the split, not the length


def test_profile_plans_have_no_guarantees() -> None:
    spec = load_model_spec("llama-3.1-8b-instruct")
    limits = ServingLimits(max_batch_size=8, max_seq_len=4096)
    plan = plan_pools(spec, limits, kv_memory_bytes=2 * GiB, phase="profile")
    assert plan.guarantees == () and plan.advice is None


@pytest.mark.parametrize("fit", [False, True])
def test_the_warmup_batch_needs_a_batch_or_memory_never_a_length(fit: bool) -> None:
    # llama-3.1-8b, 4 MiB pages: 64 MiB hold 16, the warmup batch of 32 minimal decodes 32
    spec = load_model_spec("llama-3.1-8b-instruct")
    limits = ServingLimits(max_batch_size=32, max_seq_len=256, max_num_tokens=None)
    if fit:
        with pytest.raises(InfeasiblePlanError) as e:
            plan_pools(spec, limits, kv_memory_bytes=64 * MiB, fit=True)
        assert e.value.constraint == "warmup_batch" and e.value.max_batch_size == 16, str(e.value)
        return
    plan = plan_pools(spec, limits, kv_memory_bytes=64 * MiB)
    assert plan.advice is not None
    assert (plan.advice.max_batch_size, plan.advice.max_seq_len, plan.advice.kv_memory_bytes) == (16, 0, 128 * MiB)
    assert "max_batch_size 16" in plan.warnings[0] and "128MiB" in plan.warnings[0]
