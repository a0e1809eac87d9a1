"""`plan_pools`: split a KV memory budget between a model's page pools."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from kvpool.errors import LimitsError
from kvpool.plan.batches import (
    Constraint,
    context_constraint,
    reference_batch,
    typical_step,
    warmup_constraints,
)
from kvpool.plan.families import FamilyRules, Phase, rules_for
from kvpool.plan.feasibility import base_floors, merge_floors, pages_bytes, resolve_floors
from kvpool.plan.limits import ServingLimits
from kvpool.plan.report import plan_warnings, unmet_floor_warnings
from kvpool.plan.result import GroupPlan, PoolPlan
from kvpool.plan.waterfill import waterfill
from kvpool.plan.workload import RatioPolicy
from kvpool.spec import ModelSpec, Shape, pages_per_group
from kvpool.units import format_bytes, is_positive_int

PHASES = ("final", "profile")


def ratio_from_batch(spec: ModelSpec, batch: Sequence[Shape]) -> dict[str, float]:
    """Each group's byte share of the pages `batch` needs."""
    need = pages_per_group(spec, batch)
    bytes_ = {g.name: need[g.name] * g.slot_bytes for g in spec.groups}
    total = sum(bytes_.values()) or 1
    return {k: v / total for k, v in bytes_.items()}


def check_pool_ratio(spec: ModelSpec, pool_ratio: Mapping[str, float]) -> dict[str, float]:
    """An explicit ratio: one positive share per group, summing to 1 (within 1e-3,
    then normalised). Raises LimitsError otherwise."""
    names = set(spec.group_names)
    if set(pool_ratio) != names:
        raise LimitsError(f"pool_ratio must give a share for each group {sorted(names)}, got {sorted(pool_ratio)}")
    shares = {k: float(v) for k, v in pool_ratio.items()}
    if any(not math.isfinite(v) or v <= 0 for v in shares.values()):
        raise LimitsError(f"pool_ratio shares must be positive numbers, got {shares}")
    total = sum(shares.values())
    if abs(total - 1) > 1e-3:
        raise LimitsError(f"pool_ratio shares must sum to 1, got {total:g}")
    return {k: v / total for k, v in shares.items()}


def parse_shares(text: str) -> dict[str, float]:
    """`full=0.3,sliding=0.7` -> {"full": 0.3, "sliding": 0.7} (not yet checked
    against a spec: see `check_pool_ratio`). Raises LimitsError on bad text."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not eq or not name.strip() or math.isnan(share):
            raise LimitsError(f"cannot read pool ratio {text!r}; write e.g. full=0.3,sliding=0.7")
        out[name.strip()] = share
    return out


def plan_constraints(
    limits: ServingLimits, rules: FamilyRules, phase: Phase, *, explicit_ratio: bool
) -> tuple[Constraint, ...]:
    """The batches that must fit (docs/design.md, rule 4).

    final: none with an explicit ratio (an opt-out) or without S; else the
    generic context constraint plus the family's. profile: the shapes warmup
    runs (`warmup_constraints`: the context dummy with its generated token and
    drafts, the general batch of B minimal decodes, the largest CUDA-graph batch
    around one max-length dummy), plus the family's profile constraints.
    """
    if phase == "profile":
        return warmup_constraints(limits) + rules.constraints(limits, phase)
    context = context_constraint(limits)
    generic = (context,) if context else ()
    if explicit_ratio or rules.typical_seq_len(limits) is None:
        return ()
    return generic + rules.constraints(limits, phase)


def plan_pools(
    spec: ModelSpec,
    limits: ServingLimits,
    *,
    kv_memory_bytes: int,
    pool_ratio: Mapping[str, float] | None = None,
    policy: RatioPolicy | None = None,
    fit: bool = False,
    phase: Phase = "final",
) -> PoolPlan:
    """Split `kv_memory_bytes` into whole pages per pool group of `spec`.

    Ratio, first that applies: `pool_ratio` (shares per group name; drops all
    constraints); `policy` (e.g. `Workload(lengths)`); the typical step when S
    is known (`limits.avg_seq_len`, or the model family's fallback); else the
    reference request (capacity 2049, history 2048). Constraints (see
    `plan_constraints`) are page floors; the total never exceeds the budget.
    `phase="profile"` is the temporary plan used while memory is profiled: its
    ratio follows its floors and `pool_ratio`/`policy`/S are not used.

    Raises `InfeasiblePlanError` when a floor does not fit (with `fit=True`
    the failing constraint's longest request is shrunk first, see
    `PoolPlan.notes`), `LimitsError` on a bad ratio, budget or phase.
    Pure: returns a new plan, changes nothing.
    """
    if not is_positive_int(kv_memory_bytes):
        raise LimitsError(f"kv_memory_bytes must be a positive integer, got {kv_memory_bytes!r}")
    if phase not in PHASES:
        raise LimitsError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    if pool_ratio is not None and policy is not None:
        raise LimitsError("give pool_ratio or a policy, not both")
    shares = None if pool_ratio is None else check_pool_ratio(spec, pool_ratio)
    rules = rules_for(spec)
    avg = rules.typical_seq_len(limits)
    explicit = shares is not None and phase == "final"

    def build(lim: ServingLimits) -> tuple[Constraint, ...]:
        return plan_constraints(lim, rules, phase, explicit_ratio=explicit)

    floors, results, notes = resolve_floors(spec, limits, kv_memory_bytes, build, fit=fit)
    if spec.kv_dtype_note:
        notes = (spec.kv_dtype_note, *notes)
    step: tuple[Shape, ...] | None = None
    if phase == "profile":
        name = "profile"
        ratio: dict[str, float] = {g.name: floors[g.name] * g.slot_bytes for g in spec.groups}
        notes += (
            f"profile phase: the warmup shapes need {format_bytes(pages_bytes(spec, floors))} "
            "(estimate_profile_bytes); pool_ratio, policy and avg_seq_len are not used",
        )
    elif shares is not None:
        name, ratio = "pool_ratio", shares
    elif policy is not None:
        name, ratio = policy.name, policy.ratio(spec, limits)
    elif avg is not None:
        step = typical_step(limits, avg)
        name, ratio = "typical_step", ratio_from_batch(spec, step)
    else:
        name, ratio = "reference", ratio_from_batch(spec, reference_batch())
    total_ratio = sum(ratio.values()) or 1
    ratio = {k: v / total_ratio for k, v in ratio.items()}
    pages = waterfill(
        kv_memory_bytes,
        [g.slot_bytes for g in spec.groups],
        [ratio[g.name] for g in spec.groups],
        [floors[g.name] for g in spec.groups],
    )
    total = sum(p * g.slot_bytes for p, g in zip(pages, spec.groups, strict=True)) or 1
    groups = tuple(
        GroupPlan(g.name, g.kind, g.window, g.ratio, g.slot_bytes, p, p * g.slot_bytes / total)
        for g, p in zip(spec.groups, pages, strict=True)
    )
    plan = PoolPlan(
        spec,
        limits,
        kv_memory_bytes,
        name,
        groups,
        results,
        (),
        notes,
        avg_seq_len=None if phase == "profile" else avg,
        typical_step=step,
        ratio=ratio,
        phase=phase,
    )
    if phase == "final":
        fitted = tuple(n for n in notes if n.startswith("fit:"))
        # an explicit ratio drops the floors; say which of them it leaves unmet
        opted_out = plan_constraints(limits, rules, phase, explicit_ratio=False) if explicit else ()
        plan = dataclasses.replace(plan, warnings=plan_warnings(plan) + fitted + unmet_floor_warnings(plan, opted_out))
    return plan


def estimate_profile_bytes(spec: ModelSpec, limits: ServingLimits) -> int:
    """Bytes the profile plan's floors need: one page per group and the largest
    need of each group over the warmup shapes (`warmup_constraints`), which
    warmup runs one after another. A profile plan given at least this budget
    always succeeds, holds every warmup shape, and never allocates more than
    it is given; one given less raises `InfeasiblePlanError` naming the shape
    (floors never grow the budget)."""
    floors = base_floors(spec)
    for c in plan_constraints(limits, rules_for(spec), "profile", explicit_ratio=False):
        floors = merge_floors(floors, pages_per_group(spec, c.batch))
    return pages_bytes(spec, floors)
