"""Which page counts a simulation reports and how it accumulates them: the
model's groups (a plan on a regrouped spec reports its origin's), their total
pages, a function giving their used pages now, and the peak and
time-weighted use over a run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from kvpool.cache import KVCacheManager
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.spec import decode_worst_case_pages


@dataclass
class PageUsage:
    """Peak and time-weighted used pages per reported group."""

    groups: int
    peak: list[int] = field(default_factory=list)
    used_time: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.peak, self.used_time = [0] * self.groups, [0.0] * self.groups

    def peak_at(self, used: list[int]) -> None:
        """Raise the peaks to the pages `used` now."""
        self.peak = [max(p, u) for p, u in zip(self.peak, used, strict=True)]

    def step(self, used: list[int], dt: float) -> None:
        """One step of `dt` seconds with `used` pages."""
        for k in range(self.groups):
            self.used_time[k] += used[k] * dt

    def run(
        self,
        before: list[int],
        after: list[int],
        times: list[float],
        growth: Sequence[list[int] | None],
    ) -> None:
        """A run of decode steps of `times` seconds, `before` pages used in the
        first and `after` in the last. A group whose pages the steps only add
        (`growth[k]`: pages over `before` in each step) is summed step by
        step, exactly as single steps would be; the others (pages leaving a
        window, a shared pool: None) grow about linearly (trapezoid)."""
        for k in range(self.groups):
            g = growth[k]
            if g is None:
                self.peak[k] = max(self.peak[k], after[k])
                self.used_time[k] += (before[k] + after[k]) / 2 * float(np.sum(times))  # (NumPy's pairwise sum)
                continue
            first = before[k]
            self.peak[k] = max(self.peak[k], first + g[-1])
            total = self.used_time[k]
            for grown, dt in zip(g, times, strict=True):  # added one by one, from the total so far, as single steps add
                total += (first + grown) * dt
            self.used_time[k] = total


def growing_pages(plan: PoolPlan, names: list[str]) -> list[int | None]:
    """Per reported group (`names`), what `run_growth` needs of it: the
    tokens per page of a group of its own pool whose pages only grow, 0 for
    a state group (no page of positions), None for the others. Fixed for a
    plan: a replica asks once."""
    if plan.shared:
        return [None] * len(names)
    members = group_members(plan)
    out: list[int | None] = []
    for name in names:
        (g, *more) = [plan.spec.group(m) for m in members[name]]
        if more or decode_worst_case_pages(g, plan.limits.headroom) is not None:
            out.append(None)
        else:
            out.append(0 if g.rule.per_request else g.tokens_per_block)
    return out


def run_growth(growing: list[int | None], caps: list[int], steps: int) -> list[list[int] | None]:
    """Per reported group (`growing`, from `growing_pages`), the pages rows of
    capacities `caps` in the first of `steps` decode steps add in each step,
    for a group of its own pool whose pages only grow (each row takes a page
    as its capacity crosses a page boundary; none for a state group); None
    for the others. (Plain lists: a run's few rows and steps cost less than
    NumPy's calls.)"""
    out: list[list[int] | None] = []
    for tpb in growing:
        if not tpb:
            out.append(None if tpb is None else [0] * steps)
            continue
        takes = [0] * steps  # the pages taken at each step (from 0)
        for cap in caps:  # a row takes its next page at step -(-cap // tpb) * tpb + 1 - cap, then every tpb steps
            for t in range(-(-cap // tpb) * tpb + 1 - cap, steps, tpb):
                takes[t] += 1
        out.append(list(accumulate(takes)))
    return out


def group_members(plan: PoolPlan) -> dict[str, list[str]]:
    """The plan's groups under each group results report (the model's, for a
    plan on a regrouped spec: `PoolPlan.origin`)."""
    out: dict[str, list[str]] = {}
    for g in plan.spec.groups:
        out.setdefault(plan.origin.get(g.name, g.name), []).append(g.name)
    return out


def reported_groups(plan: PoolPlan, manager: KVCacheManager) -> tuple[list[str], list[int], Callable[[], list[int]]]:
    """Reported groups, their total pages and a function giving their used pages
    now. Groups with pools of their own: total - free. Groups of a shared pool
    (`engine:vllm`, one pool): the pool's total, and the pages their regrouped
    tables hold (prefix pages held by several requests counted once overall)."""
    members = group_members(plan)
    names = list(members)
    if not plan.shared:
        totals = [manager.total_pages(g) for g in names]
        return names, totals, lambda: [t - manager.free_pages(g) for t, g in zip(totals, names, strict=True)]
    if len(plan.shared) > 1 or len(plan.shared[0].groups) < len(plan.spec.groups):
        raise KvpoolError("the simulator reports a shared pool only when every group draws from it")
    totals = [max(manager.total_pages(g) for g in members[o]) for o in names]
    first = next(iter(members.values()))[0]

    def used() -> list[int]:
        # table entries count a prefix page once per holder: scale to the pages in use
        held = [sum(manager.held_pages(g) for g in members[o]) for o in names]
        in_use, total = totals[0] - manager.free_pages(first), sum(held)
        return held if total <= in_use else [round(h * in_use / total) for h in held]

    return names, totals, used
