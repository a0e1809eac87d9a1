"""Sizing policies by name: the plans a simulation compares.

- `reference`: the boring default, ratio from the reference request (capacity
  2049, history 2048); `avg_seq_len` is ignored (family rules still apply:
  DeepSeek-V4 always plans its typical step).
- `typical`: the typical step at S = `avg_seq_len`, else the model family's
  default, else S = `max_seq_len` (what TensorRT-LLM's estimation forced; a note
  says so), with the constraints that come with it.
- `workload`: `kvpool.plan.Workload` over the trace's (prompt, output) lengths.
- `engine:vllm`, `engine:sglang`, `engine:trtllm`: that engine's own split of the
  memory (see `kvpool.sim.engine_policies`).
- `occupancy`: `kvpool.plan.occupancy.Occupancy`, pages over each request's
  time in flight, prefill chunks included (Little's law per length).
- `tuned`: a bounded search over the split, each candidate simulated on a
  sample of the trace and the fastest checked on other parts of it; the
  reference split unless one beats it on the sample, is at least as fast on
  the checks' mean and gains more than a margin (1 %) over them all
  (`kvpool.sim.tuned`); needs the trace and a step model.
- `rebalance`: starts at the `reference` split and moves it online while the
  trace runs (`kvpool.sim.rebalance`; one sliding and one full group only).
- `online`: the trace served in 4 segments, each on the split `tune` gives
  on the segment before it (the first on itself), restarting where the split
  changes by more than a margin (`kvpool.sim.online.simulate_online`); its plan
  here is the reference split, the runs' splits are the simulation's; needs
  the trace and a step model.
- `ratio:GROUP=SHARE,...`: an explicit byte share per group (no constraints).
  Groups left out share the rest in the proportions of the reference split,
  so `ratio:full=0.3` is enough for a two-group model.
"""

from __future__ import annotations

import dataclasses

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.batches import reference_batch
from kvpool.plan.families import rules_for
from kvpool.plan.sizing import parse_shares, ratio_from_batch
from kvpool.plan.workload import Workload
from kvpool.sim.engine_policies import ENGINE_POLICIES, engine_plan
from kvpool.sim.steptime import StepTimeModel
from kvpool.spec import ModelSpec
from kvpool.trace import Trace

POLICIES = ("reference", "typical", "workload", "occupancy", "tuned", "rebalance", "online")


@dataclasses.dataclass(frozen=True)
class PolicyPlan:
    """A named policy's plan, and notes on how it was read."""

    name: str
    plan: PoolPlan
    notes: tuple[str, ...] = ()


def _continues_ratio(last: str, part: str) -> bool:
    """Whether `part` (`sliding=0.7`) is another share of the `ratio:` policy `last`."""
    return last.startswith("ratio:") and "=" in part and not part.startswith("ratio:")


def parse_policies(text: str) -> list[str]:
    """`reference,typical,ratio:full=0.3` -> names; a `ratio:` entry keeps its
    commas (`ratio:full=0.3,sliding=0.7`) until the next known policy name."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if out and _continues_ratio(out[-1], part):
            out[-1] += "," + part
        elif part:
            out.append(part)
    for name in out:
        if name not in POLICIES and name not in ENGINE_POLICIES and not name.startswith("ratio:"):
            raise KvpoolError(
                f"unknown policy {name!r}; use {', '.join((*POLICIES, *ENGINE_POLICIES))} or ratio:GROUP=SHARE,..."
            )
    return out


def resolve_group(spec: ModelSpec, name: str) -> str:
    """A group name, or a kind (`full`, `sliding`, ...) that exactly one group has."""
    if name in spec.group_names:
        return name
    kinds = [g.name for g in spec.groups if g.kind == name]
    if len(kinds) == 1:
        return kinds[0]
    raise KvpoolError(
        f"{spec.name} has no group {name!r} (groups: {', '.join(spec.group_names)})"
        + (f"; kind {name!r} matches {len(kinds)} groups" if kinds else "")
    )


def full_ratio(spec: ModelSpec, shares: dict[str, float]) -> dict[str, float]:
    """Complete a partial ratio: the groups not named share `1 - sum(shares)`
    in their reference proportions."""
    given = {resolve_group(spec, k): v for k, v in shares.items()}
    rest = [g for g in spec.group_names if g not in given]
    left = 1.0 - sum(given.values())
    if rest:
        if left <= 0:
            raise KvpoolError(f"ratio {shares} leaves nothing for groups {rest}")
        ref = ratio_from_batch(spec, reference_batch())
        weight = sum(ref[g] for g in rest) or float(len(rest))
        for g in rest:
            given[g] = left * (ref[g] / weight if weight else 1.0 / len(rest))
    return given


def parse_ratio(spec: ModelSpec, text: str) -> dict[str, float]:
    """`ratio:full=0.3,...` -> a share for every group (see `full_ratio`)."""
    try:
        shares = parse_shares(text.removeprefix("ratio:"))
    except KvpoolError:
        raise KvpoolError(f"cannot read policy {text!r}; write e.g. ratio:full=0.3,sliding=0.7") from None
    return full_ratio(spec, shares)


KVPOOL_POLICIES = ("reference", "rebalance", "online", "typical", "workload")  # and ratio:..., by plan_pools alone


def kvpool_plan(
    spec: ModelSpec,
    limits: ServingLimits,
    policy: str,
    kv_memory_bytes: int,
    trace: Trace | None,
    fit: bool,
    notes: list[str],
) -> PoolPlan:
    """The plan of one of `KVPOOL_POLICIES` or a `ratio:` policy (`plan_pools`), its notes added to `notes`."""
    no_avg = dataclasses.replace(limits, avg_seq_len=None)
    if policy.startswith("ratio:"):
        return plan_pools(spec, no_avg, kv_memory_bytes=kv_memory_bytes, pool_ratio=parse_ratio(spec, policy), fit=fit)
    if policy == "workload":
        if trace is None:
            raise KvpoolError("policy workload needs a trace")
        return plan_pools(spec, no_avg, kv_memory_bytes=kv_memory_bytes, policy=Workload(trace.lengths()), fit=fit)
    if policy == "typical":
        avg = limits.avg_seq_len
        if avg is None and rules_for(spec).typical_seq_len(limits) is None:
            avg = limits.max_seq_len
            notes.append(f"typical: no --avg-seq-len and no family default, so S = max_seq_len = {avg}")
        return plan_pools(spec, dataclasses.replace(limits, avg_seq_len=avg), kv_memory_bytes=kv_memory_bytes, fit=fit)
    if policy == "rebalance":
        from kvpool.sim.ballast import split_groups

        split_groups(spec)  # RebalanceError for models it cannot move
        notes.append("rebalance: starts at the reference split and moves it online (kvpool.sim.rebalance)")
    if policy == "online":
        if trace is None:
            raise KvpoolError("policy online needs a trace")
        notes.append(
            "online: 4 segments of the trace, each on the split tuned on the segment before it (the first on itself), "
            "restarting on a new split (kvpool.sim.online); the split shown is the first segment's"
        )
    return plan_pools(spec, no_avg, kv_memory_bytes=kv_memory_bytes, fit=fit)


def plan_for(
    spec: ModelSpec,
    limits: ServingLimits,
    policy: str,
    *,
    kv_memory_bytes: int,
    trace: Trace | None = None,
    fit: bool = False,
    model: StepTimeModel | None = None,
    padding: bool = True,
) -> PolicyPlan:
    """The plan `policy` gives for this budget (see the module docstring).
    `model` (step times) and `padding` are what `tuned` simulates with.
    Raises KvpoolError subclasses (unknown policy, bad ratio, infeasible plan)."""
    notes: list[str] = []
    if policy in KVPOOL_POLICIES or policy.startswith("ratio:"):
        plan = kvpool_plan(spec, limits, policy, kv_memory_bytes, trace, fit, notes)
    elif policy in ENGINE_POLICIES:
        plan, engine_notes = engine_plan(spec, limits, policy, kv_memory_bytes=kv_memory_bytes, trace=trace)
        notes += engine_notes
    elif policy in ("occupancy", "tuned"):
        if trace is None:
            raise KvpoolError(f"policy {policy} needs a trace")
        from kvpool.sim.tuned import plan_adaptive

        plan, extra = plan_adaptive(
            spec, limits, policy, trace, model, kv_memory_bytes=kv_memory_bytes, fit=fit, padding=padding
        )
        notes.extend(extra)
    else:
        parse_policies(policy)  # raises with the list of known policies
        raise AssertionError(policy)  # pragma: no cover
    return PolicyPlan(policy, plan, tuple(notes))


def sweep_shares(points: int, low: float = 0.05, high: float = 0.95) -> list[float]:
    """`points` shares from `low` to `high`: evenly spaced, or geometrically when
    `high / low` is 20 or more (a small window's pool wants fine steps near 0);
    rounded to 4 significant digits."""
    if points < 2:
        raise KvpoolError(f"a sweep needs at least 2 points, got {points}")
    if not 0 < low < high < 1:
        raise KvpoolError(f"a sweep range needs 0 < low < high < 1, got {low:g}:{high:g}")
    if high / low >= 20:
        shares = [low * (high / low) ** (i / (points - 1)) for i in range(points)]
    else:
        shares = [low + (high - low) * i / (points - 1) for i in range(points)]
    return [float(f"{x:.4g}") for x in shares]


def parse_range(text: str) -> tuple[float, float]:
    """`0.05:0.95` -> (0.05, 0.95)."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = float(low), float(high)
    except ValueError:
        raise KvpoolError(f"cannot read sweep range {text!r}; write e.g. 0.05:0.95") from None
    if not sep or not 0 < lo < hi < 1:
        raise KvpoolError(f"sweep range {text!r} needs 0 < LOW < HIGH < 1")
    return lo, hi


def ratio_policy(group: str, share: float) -> str:
    return f"ratio:{group}={share:g}"
