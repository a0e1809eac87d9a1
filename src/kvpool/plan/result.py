"""What a plan says: pages per pool group, constraints, warnings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvpool.errors import SpecError
from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec, Shape


@dataclass(frozen=True)
class GroupPlan:
    """One pool group's share: `pages` slots of `page_bytes` each (for a state
    group a slot is one request's state)."""

    name: str
    kind: str
    window: int | None
    ratio: int | None
    page_bytes: int
    pages: int
    share: float = 0.0

    @property
    def bytes(self) -> int:
        return self.page_bytes * self.pages


@dataclass(frozen=True)
class ConstraintResult:
    """A batch that must fit, and whether it does (`short`: pages missing per group)."""

    name: str
    batch: tuple[Shape, ...]
    satisfied: bool
    short: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolPlan:
    """How a KV budget is split into page pools. `spec` is at the plan's page size."""

    spec: ModelSpec
    limits: ServingLimits
    budget_bytes: int
    policy: str
    groups: tuple[GroupPlan, ...]
    constraints: tuple[ConstraintResult, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def group(self, name: str) -> GroupPlan:
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"plan has no group {name!r}; groups: {[g.name for g in self.groups]}")

    def pages(self, name: str) -> int:
        """Slots in the pool of group `name`."""
        return self.group(name).pages

    @classmethod
    def from_pages(
        cls,
        spec: ModelSpec,
        pages: Mapping[str, int],
        limits: ServingLimits | None = None,
        *,
        policy: str = "manual",
    ) -> PoolPlan:
        """A plan with hand-chosen pool sizes (tests, engines that size pools
        themselves). Every group of `spec` must be given."""
        limits = limits or ServingLimits()
        if limits.tokens_per_block is not None:
            spec = spec.with_tokens_per_block(limits.tokens_per_block)
        missing = set(spec.group_names) - set(pages)
        if missing:
            raise SpecError(f"no page count given for groups {sorted(missing)}")
        groups = tuple(
            GroupPlan(g.name, g.kind, g.window, g.ratio, g.slot_bytes, int(pages[g.name]))
            for g in spec.groups
        )
        total = sum(g.bytes for g in groups) or 1
        groups = tuple(
            GroupPlan(g.name, g.kind, g.window, g.ratio, g.page_bytes, g.pages, g.bytes / total)
            for g in groups
        )
        return cls(spec, limits, sum(g.bytes for g in groups), policy, groups)
