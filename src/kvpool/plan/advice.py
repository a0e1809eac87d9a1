"""What would make a plan hold what it must: the smallest single change.

A final plan must hold its constraints (or `plan_pools` raises) and should hold
its guarantees (`batches.guarantees`: the engine's warmup shapes and one request
at max_seq_len). Where the budget cannot, `advise` finds each single change that
would, everything else kept: the largest max_seq_len, max_batch_size and
max_num_tokens, the smallest KV budget, and (for an explicit ratio the budget
could serve) the nearest split. Every answer is re-planned before it is given:
one whose plan would still raise or miss a guarantee is dropped, never printed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from kvpool.plan.feasibility import largest_fitting, largest_fitting_length
from kvpool.plan.limits import ServingLimits
from kvpool.plan.result import Advice, MiB

# (limits, budget) -> whether a plan at them holds every constraint and guarantee
Holds = Callable[[ServingLimits, int], bool]


def advise(
    limits: ServingLimits,
    budget: int,
    tpb: int,
    *,
    holds: Holds,
    verify: Holds,
    memory: int,
    split: Mapping[str, float] | None = None,
) -> Advice:
    """Each single change that makes the plan hold everything (`Advice`).

    `holds` is the fast check the searches bisect on (floors against the
    budget); `verify` re-plans an answer in full and drops it when the plan
    would still fail. `memory` is the budget the floors need at `limits`
    (rounded up to whole MiB here, so that the printed size holds them); `split`
    the ratio the caller found and verified, if any."""

    def checked(changed: ServingLimits, at: int = budget) -> bool:
        return verify(changed, at)

    best_b = largest_fitting(1, limits.max_batch_size, lambda b: holds(limits.clamped(max_batch_size=b), budget))
    best_n = 0
    if limits.max_num_tokens is not None:
        best_n = largest_fitting(
            1, limits.max_num_tokens, lambda n: holds(dataclasses.replace(limits, max_num_tokens=n), budget)
        )
    kv = -(-memory // MiB) * MiB
    return Advice(
        max_seq_len=longest(limits, budget, tpb, holds=holds, verify=verify),
        max_batch_size=best_b if best_b >= 1 and checked(limits.clamped(max_batch_size=best_b)) else 0,
        max_num_tokens=(best_n if best_n >= 1 and checked(dataclasses.replace(limits, max_num_tokens=best_n)) else 0),
        kv_memory_bytes=kv if checked(limits, kv) else 0,
        pool_ratio=split,
    )


def longest(limits: ServingLimits, budget: int, tpb: int, *, holds: Holds, verify: Holds) -> int:
    """The largest max_seq_len (others unchanged) at which a plan holds
    everything, re-planned (`verify`); 0 if none. Decodes end at L (the
    max_seq_len guarantee) or, as warmup's dummies do, at L + d + E (a family's
    longest decode): the search runs from either page alignment and keeps the
    larger (`largest_fitting_length`)."""

    def fits(n: int) -> bool:
        return holds(limits.clamped(max_seq_len=n), budget)

    lead = limits.max_draft_len + limits.num_extra_kv_tokens
    best = largest_fitting_length(1, limits.max_seq_len, tpb, fits)
    if lead % tpb:
        best = max(best, largest_fitting_length(1, limits.max_seq_len, tpb, fits, lead=lead))
    return best if best >= 1 and verify(limits.clamped(max_seq_len=best), budget) else 0
