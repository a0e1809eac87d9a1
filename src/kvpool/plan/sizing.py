"""`plan_pools`: split a KV memory budget between a model's page pools."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from kvpool.errors import InfeasiblePlanError, LimitsError
from kvpool.plan.advice import advise, longest
from kvpool.plan.batches import (
    Constraint,
    context_constraint,
    guarantees,
    reference_batch,
    typical_step,
    warmup_constraints,
)
from kvpool.plan.families import FamilyRules, Phase, rules_for
from kvpool.plan.feasibility import (
    Floors,
    base_floors,
    batch_floors,
    check_one_page_each,
    describe_batch,
    merge_floors,
    pages_bytes,
    resolve_floors,
    shortfall,
)
from kvpool.plan.limits import ServingLimits
from kvpool.plan.report import guarantee_text, guarantee_warnings, plan_warnings, unmet_floor_warnings
from kvpool.plan.result import Advice, ConstraintResult, GroupPlan, MiB, PoolPlan, ratio_text
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


def plan_guarantees(limits: ServingLimits, phase: Phase) -> tuple[Constraint, ...]:
    """What a final plan holds whenever its budget can (`batches.guarantees`);
    none in the profile phase, whose constraints are the warmup shapes."""
    return guarantees(limits) if phase == "final" else ()


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
    constraints and guarantees); `policy` (e.g. `Workload(lengths)`); the
    typical step when S is known (`limits.avg_seq_len`, or the model family's
    fallback); else the reference request (capacity 2049, history 2048).
    Constraints (`plan_constraints`) and guarantees (`plan_guarantees`: the
    engine's warmup shapes and one request at max_seq_len) are page floors; the
    total never exceeds the budget. A guarantee the budget cannot hold is the
    first warning, with the smallest change that would (`PoolPlan.advice`).
    `phase="profile"` is the temporary plan used while memory is profiled: its
    ratio follows its floors and `pool_ratio`/`policy`/S are not used.

    `fit=True` takes that change where it is a split (an explicit ratio) or a
    shorter max_seq_len (the plan is then at that length; a note says so).
    Raises `InfeasiblePlanError` when a constraint does not fit (naming what
    would, `fit` or not), or with `fit=True` when no split or length holds the
    guarantees; `LimitsError` on a bad ratio, budget or phase.
    Pure: returns a new plan, changes nothing.
    """
    if not is_positive_int(kv_memory_bytes):
        raise LimitsError(f"kv_memory_bytes must be a positive integer, got {kv_memory_bytes!r}")
    if phase not in PHASES:
        raise LimitsError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    if pool_ratio is not None and policy is not None:
        raise LimitsError("give pool_ratio or a policy, not both")
    shares = None if pool_ratio is None else check_pool_ratio(spec, pool_ratio)
    check_one_page_each(spec, kv_memory_bytes)
    return Sizer(spec, kv_memory_bytes, shares, policy, phase).plan(limits, fit=fit)


class Sizer:
    """One budget's sizing inputs (spec, budget, ratio source, phase) and the
    plans they give at any limits. `plan` is `plan_pools`; `holds` and
    `verify` are what `advice.advise` searches and re-plans with."""

    def __init__(
        self,
        spec: ModelSpec,
        budget: int,
        shares: Mapping[str, float] | None,
        policy: RatioPolicy | None,
        phase: Phase,
    ) -> None:
        self.spec, self.budget, self.shares, self.policy, self.phase = spec, budget, shares, policy, phase
        self.rules = rules_for(spec)
        self.explicit = shares is not None and phase == "final"

    def floors(self, limits: ServingLimits, budget: int, *, pin: bool) -> Floors:
        hard = plan_constraints(limits, self.rules, self.phase, explicit_ratio=self.explicit)
        return resolve_floors(self.spec, budget, hard, plan_guarantees(limits, self.phase), pin=pin)

    def ratio(self, limits: ServingLimits, floors: Mapping[str, int]) -> tuple[str, dict[str, float]]:
        """Where the ratio comes from and the byte share per group (normalised)."""
        spec, avg = self.spec, self.rules.typical_seq_len(limits)
        ratio: dict[str, float]
        if self.phase == "profile":
            name, ratio = "profile", {g.name: float(floors[g.name] * g.slot_bytes) for g in spec.groups}
        elif self.shares is not None:
            name, ratio = "pool_ratio", dict(self.shares)
        elif self.policy is not None:
            name, ratio = self.policy.name, self.policy.ratio(spec, limits)
        elif avg is not None:
            name, ratio = "typical_step", ratio_from_batch(spec, typical_step(limits, avg))
        else:
            name, ratio = "reference", ratio_from_batch(spec, reference_batch())
        total = sum(ratio.values()) or 1
        return name, {k: v / total for k, v in ratio.items()}

    def pages(self, budget: int, ratio: Mapping[str, float], floors: Mapping[str, int]) -> dict[str, int]:
        groups = self.spec.groups
        got = waterfill(
            budget, [g.slot_bytes for g in groups], [ratio[g.name] for g in groups], [floors[g.name] for g in groups]
        )
        return {g.name: p for g, p in zip(groups, got, strict=True)}

    def split(self, limits: ServingLimits, budget: int, *, pin: bool | None = None) -> tuple[PoolPlan | None, Floors]:
        """The plan at `limits` and `budget` without warnings or advice (None when
        a constraint does not fit), and its floors. Guarantees are pinned where
        the budget holds them unless the ratio is explicit (or `pin` says)."""
        f = self.floors(limits, budget, pin=not self.explicit if pin is None else pin)
        if f.failed is not None:
            return None, f
        name, ratio = self.ratio(limits, f.pages)
        pages = self.pages(budget, ratio, f.pages)
        total = sum(pages[g.name] * g.slot_bytes for g in self.spec.groups) or 1
        groups = tuple(
            GroupPlan(
                g.name, g.kind, g.window, g.ratio, g.slot_bytes, pages[g.name], pages[g.name] * g.slot_bytes / total
            )
            for g in self.spec.groups
        )
        avg = self.rules.typical_seq_len(limits)
        step = typical_step(limits, avg) if name == "typical_step" and avg is not None else None
        plan = PoolPlan(
            self.spec,
            limits,
            budget,
            name,
            groups,
            f.results,
            avg_seq_len=None if self.phase == "profile" else avg,
            typical_step=step,
            ratio=ratio,
            phase=self.phase,
        )
        return dataclasses.replace(plan, guarantees=tuple(self.held(c, pages) for c in f.kept)), f

    def held(self, c: Constraint, pages: Mapping[str, int]) -> ConstraintResult:
        """Whether `pages` hold `c`'s batch, and the pages short per group."""
        short = {k: n - pages[k] for k, n in batch_floors(self.spec, c.batch).items() if n > pages[k]}
        return ConstraintResult(c.name, c.batch, not short, short)

    def holds(self, limits: ServingLimits, budget: int) -> bool:
        """Whether a plan at `limits` and `budget` holds every constraint and
        guarantee, from the floors alone (a pinned floor is always met; an
        explicit ratio's pages do not depend on the limits)."""
        f = self.floors(limits, budget, pin=not self.explicit)
        if f.failed is not None:
            return False
        if not self.explicit:
            return len(f.pinned) == len(f.kept)
        assert self.shares is not None
        pages = self.pages(budget, self.shares, f.pages)
        return all(n <= pages[k] for c in f.kept for k, n in batch_floors(self.spec, c.batch).items())

    def verify(self, limits: ServingLimits, budget: int) -> bool:
        """`holds`, by planning in full (the policy's ratio included)."""
        plan, _ = self.split(limits, budget)
        return plan is not None and all(c.satisfied for c in plan.guarantees)

    def advise(self, limits: ServingLimits) -> Advice:
        """The smallest single changes that hold everything (`advice.advise`)."""
        hard = plan_constraints(limits, self.rules, self.phase, explicit_ratio=self.explicit)
        every = resolve_floors(self.spec, 2**63, hard, plan_guarantees(limits, self.phase))
        memory = pages_bytes(self.spec, every.pages)
        split = None
        if self.explicit:
            memory = self.ratio_budget(every.pages)
            split = self.nearest_split(limits)
        return advise(
            limits,
            self.budget,
            self.spec.tokens_per_block,
            holds=self.holds,
            verify=self.verify,
            memory=memory,
            split=split,
        )

    def ratio_budget(self, floors: Mapping[str, int]) -> int:
        """A budget whose explicit-ratio split gives every group its floor:
        floor(M x share / page) >= floor for each group."""
        assert self.shares is not None
        return max(
            math.ceil(Fraction(floors[g.name] * g.slot_bytes) / Fraction(self.shares[g.name])) for g in self.spec.groups
        )

    def nearest_split(self, limits: ServingLimits) -> dict[str, float] | None:
        """For an explicit ratio: the split the budget's floors give (the ratio
        with the short groups raised to their floors), written with as few
        decimals (4, 6 or 8) as re-plan to a plan that holds everything; None
        when the budget cannot hold it whatever the split."""
        assert self.shares is not None
        plan, f = self.split(limits, self.budget, pin=True)
        if plan is None or len(f.pinned) < len(f.kept):
            return None
        asked = self.pages(self.budget, self.shares, base_floors(self.spec))
        return self.shortest_holding(plan, limits, {g.name for g in plan.groups if g.pages > asked[g.name]})

    def shortest_holding(self, plan: PoolPlan, limits: ServingLimits, raised: set[str]) -> dict[str, float] | None:
        """`plan`'s shares with as few decimals (4, 6 or 8) as re-plan to a plan
        that holds everything (`rounded_shares`); None when none does."""
        for digits in (4, 6, 8):
            shares = rounded_shares(plan, self.budget, raised, digits)
            total = sum(shares.values())
            if abs(total - 1) > 1e-3 or min(shares.values()) <= 0:
                continue
            trial = Sizer(self.spec, self.budget, {k: v / total for k, v in shares.items()}, None, self.phase)
            if trial.verify(limits, self.budget):
                return shares
        return None

    def longest(self, limits: ServingLimits) -> int:
        """The largest max_seq_len that holds everything (`advice.longest`)."""
        return longest(limits, self.budget, self.spec.tokens_per_block, holds=self.holds, verify=self.verify)

    def plan(self, limits: ServingLimits, *, fit: bool) -> PoolPlan:
        """`plan_pools` at `limits` (its docstring)."""
        plan, f = self.split(limits, self.budget)
        if plan is None:
            assert f.failed is not None
            if fit and (length := self.longest(limits)):
                return self.refit(limits, length)
            raise self.infeasible(limits, f, self.advise(limits), fit=fit)
        if all(c.satisfied for c in plan.guarantees):
            return self.finish(plan, None)
        if fit and not self.explicit and (length := self.longest(limits)):
            return self.refit(limits, length)
        advice = self.advise(limits)
        if fit and advice.pool_ratio is not None:
            pinned, _ = self.split(limits, self.budget, pin=True)
            assert pinned is not None
            note = (
                f"fit: the pool ratio could not hold every guarantee, so the groups short of one keep "
                f"their floors (about --pool-ratio {ratio_text(advice.pool_ratio)})"
            )
            return self.finish(dataclasses.replace(pinned, notes=(note,)), None)
        if fit and advice.max_seq_len:
            return self.refit(limits, advice.max_seq_len)
        if fit:
            unmet = next(c for c in plan.guarantees if not c.satisfied)
            group = max(unmet.short, key=lambda k: unmet.short[k])
            raise InfeasiblePlanError(
                f"--fit: no split of {format_bytes(self.budget)} and no shorter max_seq_len holds "
                f"{guarantee_text(unmet.name, limits)}; {'; '.join(advice.changes(limits, self.budget)) or 'nothing'} would",
                constraint=unmet.name,
                group=group,
                short_pages=unmet.short[group],
                max_batch_size=advice.max_batch_size,
                max_num_tokens=advice.max_num_tokens,
                kv_memory_bytes=advice.kv_memory_bytes,
            )
        return self.finish(plan, advice)

    def refit(self, limits: ServingLimits, length: int) -> PoolPlan:
        """The plan at max_seq_len `length` (verified to hold everything), noting
        what the constraints asked for at the original length."""
        shorter = limits.clamped(max_seq_len=length)
        plan, _ = self.split(shorter, self.budget)
        assert plan is not None
        asked = {
            c.name: c.batch for c in plan_constraints(limits, self.rules, self.phase, explicit_ratio=self.explicit)
        }
        results = tuple(
            dataclasses.replace(c, shrunk_from=max(asked[c.name], key=lambda s: s.capacity))
            if c.name in asked and asked[c.name] != c.batch
            else c
            for c in plan.constraints
        )
        note = (
            f"fit: max_seq_len lowered from {limits.max_seq_len} to {length}, the longest that "
            f"{format_bytes(self.budget)} holds with every constraint and guarantee"
        )
        return self.finish(dataclasses.replace(plan, constraints=results, notes=(note,)), None)

    def finish(self, plan: PoolPlan, advice: Advice | None) -> PoolPlan:
        """The plan with its notes and warnings: a missed guarantee first (with
        `advice`), then what the warmup finds, what --fit changed, and the
        floors an explicit ratio leaves unmet."""
        notes = plan.notes + self.floor_notes(plan)
        if self.spec.kv_dtype_note:
            notes = (self.spec.kv_dtype_note, *notes)
        if self.phase == "profile":
            need = format_bytes(estimate_profile_bytes(self.spec, plan.limits))
            notes += (
                f"profile phase: the warmup shapes need {need} (estimate_profile_bytes); "
                "pool_ratio, policy and avg_seq_len are not used",
            )
            return dataclasses.replace(plan, notes=notes)
        plan = dataclasses.replace(plan, notes=notes, advice=advice)
        first = guarantee_warnings(plan)
        fitted = tuple(n for n in notes if n.startswith("fit:"))
        opted_out: tuple[Constraint, ...] = ()
        if self.explicit:
            held = {c.batch for c in plan_guarantees(plan.limits, self.phase)}
            every = plan_constraints(plan.limits, self.rules, self.phase, explicit_ratio=False)
            opted_out = tuple(c for c in every if c.batch not in held)
        warnings = first + plan_warnings(plan, guarantees=False) + fitted + unmet_floor_warnings(plan, opted_out)
        return dataclasses.replace(plan, warnings=warnings)

    def floor_notes(self, plan: PoolPlan) -> tuple[str, ...]:
        """Where a pinned guarantee moved the split off its ratio: which group it
        raised, and from how many pages."""
        met = [c for c in plan.guarantees if c.satisfied]
        if not met or self.phase == "profile":
            return ()
        f = self.floors(plan.limits, self.budget, pin=False)
        plain = self.pages(self.budget, plan.ratio, f.pages)
        out = []
        for g in plan.groups:
            if g.pages > plain[g.name] and (
                why := [c.name for c in met if batch_floors(self.spec, c.batch)[g.name] > plain[g.name]]
            ):
                out.append(
                    f"guarantee {', '.join(why)} holds group '{g.name}' at {g.pages:,} pages "
                    f"(the {plan.policy} ratio alone gives it {plain[g.name]:,})"
                )
        return tuple(out)

    def infeasible(self, limits: ServingLimits, f: Floors, advice: Advice, *, fit: bool) -> InfeasiblePlanError:
        """The error for the first constraint that does not fit: the group it grows
        most, the pages short there, and each single change that would fit."""
        assert f.failed is not None
        constraint, before, merged = f.failed
        group, short, excess = shortfall(self.spec, self.budget, constraint, before, merged)
        hints = [
            f"largest max_batch_size that fits: {advice.max_batch_size or 'none'}",
            f"largest max_seq_len that fits: {advice.max_seq_len or 'none'}",
        ]
        if limits.max_num_tokens is not None:
            hints.append(f"largest max_num_tokens that fits: {advice.max_num_tokens or 'none'}")
        if advice.kv_memory_bytes:
            hints.append(f"a KV budget that fits: {advice.kv_memory_bytes // MiB}MiB")
        if not fit and advice.max_seq_len:
            hints.append(f"or pass --fit to plan at max_seq_len {advice.max_seq_len}")
        return InfeasiblePlanError(
            f"budget {format_bytes(self.budget)} cannot hold constraint '{constraint.name}' "
            f"[{describe_batch(constraint.batch)} capacity/history]: group '{group}' is {short} pages "
            f"({format_bytes(excess)}) short; {'; '.join(hints)}",
            constraint=constraint.name,
            group=group,
            short_pages=short,
            max_batch_size=advice.max_batch_size,
            max_seq_len=advice.max_seq_len,
            max_num_tokens=advice.max_num_tokens,
            kv_memory_bytes=advice.kv_memory_bytes,
        )


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


def rounded_shares(plan: PoolPlan, budget: int, raised: set[str], digits: int) -> dict[str, float]:
    """Each group's share of `budget` in `plan` to `digits` decimals: rounded up for
    the groups `raised` to their floors (so they keep them), down for the others."""
    scale = 10**digits
    return {
        g.name: round((math.ceil if g.name in raised else math.floor)(g.bytes * scale / budget) / scale, digits)
        for g in plan.groups
    }
