"""What a plan says: pages per pool group, constraints, warnings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.errors import LimitsError, SpecError
from kvpool.plan.batches import REFERENCE_REQUEST, decode_shape
from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec, Shape, pages_needed, pages_per_group


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
    """A batch that must fit, and whether it does (`short`: pages missing per
    group). `shrunk_from` is the longest request as the constraint asked for it
    when `fit=True` shrank it to the one in `batch`."""

    name: str
    batch: tuple[Shape, ...]
    satisfied: bool
    short: Mapping[str, int] = field(default_factory=dict)
    shrunk_from: Shape | None = None


@dataclass(frozen=True)
class PoolPlan:
    """How a KV budget is split into page pools. `spec` is at the plan's page size.

    `policy` names where the ratio came from (`reference`, `typical_step`,
    `pool_ratio`, `workload`, `profile`, `manual`); `avg_seq_len` is the S in
    force (given, or a family's fallback), `typical_step` the batch the ratio
    came from when there was one; `ratio` the target byte share per group.
    """

    spec: ModelSpec
    limits: ServingLimits
    budget_bytes: int
    policy: str
    groups: tuple[GroupPlan, ...]
    constraints: tuple[ConstraintResult, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    avg_seq_len: int | None = None
    typical_step: tuple[Shape, ...] | None = None
    ratio: Mapping[str, float] = field(default_factory=dict)
    phase: str = "final"

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
        missing = set(spec.group_names) - set(pages)
        if missing:
            raise SpecError(f"no page count given for groups {sorted(missing)}")
        unknown = set(pages) - set(spec.group_names)
        if unknown:
            raise SpecError(f"page counts given for groups {sorted(unknown)} that {spec.name} does not have")
        for name in spec.group_names:
            n = pages[name]
            if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
                raise LimitsError(f"group {name!r}: pages must be a positive integer, got {n!r}")
        groups = tuple(
            GroupPlan(g.name, g.kind, g.window, g.ratio, g.slot_bytes, int(pages[g.name])) for g in spec.groups
        )
        total = sum(g.bytes for g in groups) or 1
        groups = tuple(
            GroupPlan(g.name, g.kind, g.window, g.ratio, g.page_bytes, g.pages, g.bytes / total) for g in groups
        )
        return cls(spec, limits, sum(g.bytes for g in groups), policy, groups)

    def max_requests(self, shape: tuple[int, int]) -> int:
        """How many requests of one (capacity, history) shape the pools hold at
        once: the smallest `pages // pages_needed` over groups."""
        counts = []
        for g in self.spec.groups:
            need = pages_needed(g, shape[0], shape[1])
            if need:
                counts.append(self.pages(g.name) // need)
        return min(counts) if counts else 0

    def max_concurrency(self) -> dict[str, int | None]:
        """Requests that fit at once: of the reference shape, decoding at S (None
        without S) and decoding at L. A decode at length n has history n - 1 - d."""
        s, limits = self.avg_seq_len, self.limits
        return {
            "reference": self.max_requests(REFERENCE_REQUEST),
            "avg_seq_len": None if s is None else self.max_requests(decode_shape(s, limits)),
            "max_seq_len": self.max_requests(decode_shape(limits.max_seq_len, limits)),
        }

    def check(self, name: str, batch: tuple[Shape, ...]) -> ConstraintResult:
        """Whether `batch` fits the pools all at once, and the pages short per group."""
        need = pages_per_group(self.spec, batch)
        short = {k: v - self.pages(k) for k, v in need.items() if v > self.pages(k)}
        return ConstraintResult(name, tuple(batch), not short, short)

    def to_json(self) -> dict[str, Any]:
        """The plan in the `kvpool plan --json` shape."""
        return {
            "policy": self.policy,
            "kv_dtype": self.spec.kv_dtype,
            "kv_dtype_note": self.spec.kv_dtype_note,
            "budget_bytes": self.budget_bytes,
            "total_bytes": self.total_bytes,
            "groups": [
                {
                    "name": g.name,
                    "kind": g.kind,
                    "window": g.window,
                    "page_bytes": g.page_bytes,
                    "pages": g.pages,
                    "bytes": g.bytes,
                }
                for g in self.groups
            ],
            "constraints": [
                {"name": c.name, "satisfied": c.satisfied, "short": dict(c.short)} for c in self.constraints
            ],
            "max_concurrency": self.max_concurrency(),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }
