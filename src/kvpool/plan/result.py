"""What a plan says: pages per pool group, constraints, warnings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.errors import LimitsError, SpecError
from kvpool.plan.batches import REFERENCE_REQUEST, decode_shape
from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec, Shape, pages_needed, pages_per_group
from kvpool.units import format_bytes, is_positive_int


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
class SharedPool:
    """One pool that several groups of equal page bytes draw from (vLLM v1's
    shared block pool): `pages` slots of `page_bytes`, counted once."""

    name: str
    page_bytes: int
    pages: int
    groups: tuple[str, ...]

    @property
    def bytes(self) -> int:
        return self.page_bytes * self.pages


MiB = 2**20


@dataclass(frozen=True)
class Advice:
    """The single changes that make a plan hold everything it must, each with
    the other limits and the budget unchanged (0 or None: no such change).

    `max_seq_len`, `max_batch_size`, `max_num_tokens`: the largest value that
    does; `kv_memory_bytes`: the smallest budget that does at the limits asked,
    in whole MiB; `pool_ratio`: for an explicit ratio whose budget could hold it
    all, the split that does. `fit=True` takes the split, else the length.
    """

    max_seq_len: int = 0
    max_batch_size: int = 0
    max_num_tokens: int = 0
    kv_memory_bytes: int = 0
    pool_ratio: Mapping[str, float] | None = None

    def changes(self, limits: ServingLimits, budget: int) -> list[str]:
        """The changes as short phrases, the one `--fit` takes marked."""
        out = []
        fit_takes = " (--fit takes it)"
        if self.pool_ratio is not None:
            out.append(f"the split --pool-ratio {ratio_text(self.pool_ratio)}{fit_takes}")
            fit_takes = ""
        if 0 < self.max_seq_len < limits.max_seq_len:
            out.append(f"max_seq_len {self.max_seq_len}{fit_takes}")
        if 0 < self.max_batch_size < limits.max_batch_size:
            out.append(f"max_batch_size {self.max_batch_size}")
        if limits.max_num_tokens is not None and 0 < self.max_num_tokens < limits.max_num_tokens:
            out.append(f"max_num_tokens {self.max_num_tokens}")
        if self.kv_memory_bytes > budget:
            more = format_bytes(self.kv_memory_bytes - budget)
            out.append(f"a KV budget of {self.kv_memory_bytes // MiB}MiB ({more} more)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "max_seq_len": self.max_seq_len,
            "max_batch_size": self.max_batch_size,
            "max_num_tokens": self.max_num_tokens,
            "kv_memory_bytes": self.kv_memory_bytes,
            "pool_ratio": None if self.pool_ratio is None else dict(self.pool_ratio),
        }


def ratio_text(ratio: Mapping[str, float]) -> str:
    """`full=0.2812,sliding=0.7188`, as `--pool-ratio` reads it."""
    return ",".join(f"{k}={v:g}" for k, v in ratio.items())


def _check_pages(spec: ModelSpec, pages: Mapping[str, int]) -> None:
    """A positive page count for every group of `spec`, and for nothing else."""
    missing = set(spec.group_names) - set(pages)
    if missing:
        raise SpecError(f"no page count given for groups {sorted(missing)}")
    unknown = set(pages) - set(spec.group_names)
    if unknown:
        raise SpecError(f"page counts given for groups {sorted(unknown)} that {spec.name} does not have")
    for name in spec.group_names:
        n = pages[name]
        if not is_positive_int(int(n) if isinstance(n, np.integer) else n):
            raise LimitsError(f"group {name!r}: pages must be a positive integer, got {n!r}")


@dataclass(frozen=True)
class PoolPlan:
    """How a KV budget is split into page pools. `spec` is at the plan's page size.

    `policy` names where the ratio came from (`reference`, `typical_step`,
    `pool_ratio`, `workload`, `profile`, `manual`); `avg_seq_len` is the S in
    force (given, or a family's fallback), `typical_step` the batch the ratio
    came from when there was one; `ratio` the target byte share per group.
    `guarantees`: what the plan holds whenever its budget can (the engine's
    warmup shapes, one request at max_seq_len) and whether it does; `advice`:
    where one is missed, the smallest changes that would hold it.
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
    # pools several groups share (`from_shared_pool`); their groups' `pages` are the pool's
    shared: tuple[SharedPool, ...] = ()
    # plan group -> the model's group whose layers it holds, when the spec was regrouped
    origin: Mapping[str, str] = field(default_factory=dict)
    guarantees: tuple[ConstraintResult, ...] = ()
    advice: Advice | None = None

    @property
    def total_bytes(self) -> int:
        """Allocated bytes: a shared pool counted once."""
        inside = {g for s in self.shared for g in s.groups}
        return sum(g.bytes for g in self.groups if g.name not in inside) + sum(s.bytes for s in self.shared)

    def pool_of(self, group: str) -> str:
        """The pool `group` takes pages from: a shared pool's name, else the group's own."""
        for s in self.shared:
            if group in s.groups:
                return s.name
        return group

    def share_of(self, group: str) -> float:
        """Byte share of model group `group`: its own, or on a regrouped spec
        (`origin`) the sum over the groups holding its layers (for a shared pool,
        the share of the pool's groups, padding included)."""
        if group in self.origin.values():
            return sum(g.share for g in self.groups if self.origin.get(g.name) == group)
        return self.group(group).share

    def pool_pages(self) -> dict[str, int]:
        """Pages per pool (a shared pool once, under its name)."""
        return {self.pool_of(g.name): g.pages for g in self.groups}

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
        _check_pages(spec, pages)
        groups = tuple(
            GroupPlan(g.name, g.kind, g.window, g.ratio, g.slot_bytes, int(pages[g.name])) for g in spec.groups
        )
        total = sum(g.bytes for g in groups) or 1
        groups = tuple(
            GroupPlan(g.name, g.kind, g.window, g.ratio, g.page_bytes, g.pages, g.bytes / total) for g in groups
        )
        return cls(spec, limits, sum(g.bytes for g in groups), policy, groups)

    @classmethod
    def from_shared_pool(
        cls,
        spec: ModelSpec,
        pages: int,
        limits: ServingLimits | None = None,
        *,
        name: str = "shared",
        policy: str = "manual",
        origin: Mapping[str, str] | None = None,
    ) -> PoolPlan:
        """A plan whose groups all draw from one pool of `pages` pages (every
        group must have the same page bytes; a state group's slot counts as one
        page). `origin` maps each group to the model group it holds layers of."""
        sizes = {g.slot_bytes for g in spec.groups}
        if len(sizes) != 1:
            raise SpecError(f"{spec.name}: a shared pool needs equal page bytes, got {sorted(sizes)}")
        if name in spec.group_names:
            raise SpecError(f"shared pool name {name!r} is also a group name")
        plan = cls.from_pages(spec, {g: pages for g in spec.group_names}, limits, policy=policy)
        pool = SharedPool(name, sizes.pop(), int(pages), tuple(spec.group_names))
        share = 1 / len(spec.groups)
        groups = tuple(dataclasses.replace(g, share=share) for g in plan.groups)
        return dataclasses.replace(
            plan, groups=groups, budget_bytes=pool.bytes, shared=(pool,), origin=dict(origin or {})
        )

    def max_requests(self, shape: tuple[int, int]) -> int:
        """How many requests of one (capacity, history) shape the pools hold at
        once: the smallest `pages // pages_needed` over groups."""
        need: dict[str, int] = {}
        for g in self.spec.groups:
            pool = self.pool_of(g.name)
            need[pool] = need.get(pool, 0) + pages_needed(g, shape[0], shape[1])
        pages = self.pool_pages()
        counts = [pages[k] // n for k, n in need.items() if n]
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
        need: dict[str, int] = {}
        for k, v in pages_per_group(self.spec, batch).items():
            need[self.pool_of(k)] = need.get(self.pool_of(k), 0) + v
        pages = self.pool_pages()
        short = {k: v - pages[k] for k, v in need.items() if v > pages[k]}
        return ConstraintResult(name, tuple(batch), not short, short)

    def to_json(self) -> dict[str, Any]:
        """The plan in the `kvpool plan --json` shape (plus `shared_pools` for a
        plan with a shared pool)."""
        out = {
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
            "guarantees": [{"name": c.name, "satisfied": c.satisfied, "short": dict(c.short)} for c in self.guarantees],
            "advice": None if self.advice is None else self.advice.to_json(),
            "max_concurrency": self.max_concurrency(),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }
        if self.shared:
            out["shared_pools"] = [
                {"name": p.name, "page_bytes": p.page_bytes, "pages": p.pages, "groups": list(p.groups)}
                for p in self.shared
            ]
        return out
