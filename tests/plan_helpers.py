"""Factories and assertion helpers for the plan tests (imported by test_plan_*.py)."""

from __future__ import annotations

from collections.abc import Mapping

from kvpool.plan import PoolPlan
from kvpool.spec import LayerGroup, ModelSpec, Shape, pages_per_group


def group(
    name: str,
    kind: str = "full",
    *,
    row_bytes: int = 1024,
    tpb: int = 32,
    window: int | None = None,
    ratio: int | None = None,
    state_bytes: int = 0,
) -> LayerGroup:
    """One pool group with the given life cycle and bytes per row."""
    return LayerGroup(
        name,
        kind,
        (0,),
        tpb,
        row_bytes=0 if kind == "state" else row_bytes,  # type: ignore[arg-type]
        state_bytes=state_bytes,
        window=window,
        ratio=ratio,
    )


def model(*groups: LayerGroup, family: str = "attention", name: str = "toy") -> ModelSpec:
    """A model spec made of `groups` (all at the first group's page size)."""
    tpb = groups[0].tokens_per_block
    return ModelSpec(name, family, tuple(groups), tpb, "bf16", 1, len(groups), 131072)


def hybrid(
    *, full_row: int = 1024, sliding_row: int = 1024, window: int = 1024, tpb: int = 32, family: str = "attention"
) -> ModelSpec:
    """A full + sliding model (the Gemma shape)."""
    return model(
        group("full", row_bytes=full_row, tpb=tpb),
        group("sliding", "sliding", row_bytes=sliding_row, tpb=tpb, window=window),
        family=family,
    )


def assert_within_budget(plan: PoolPlan) -> None:
    total = sum(g.pages * g.page_bytes for g in plan.groups)
    assert total == plan.total_bytes
    assert total <= plan.budget_bytes, (
        f"plan allocates {total} bytes > budget {plan.budget_bytes}: "
        f"{[(g.name, g.pages, g.page_bytes) for g in plan.groups]}"
    )


def assert_holds(plan: PoolPlan, batch: tuple[Shape, ...] | list[Shape], what: str = "batch") -> None:
    """Every group has at least the pages `batch` needs."""
    need = pages_per_group(plan.spec, batch)
    short = {k: (need[k], plan.pages(k)) for k in need if need[k] > plan.pages(k)}
    assert not short, f"{what} does not fit: group -> (needed, has) {short}"


def assert_pages(plan: PoolPlan, expected: Mapping[str, int]) -> None:
    got = {g.name: g.pages for g in plan.groups}
    assert got == dict(expected), f"pages per group: got {got}, expected {dict(expected)}"
