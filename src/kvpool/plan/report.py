"""Warnings about a finished plan: what it cannot hold that the engine will ask for."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.plan.batches import Constraint, decode_shape, minimal_decode
from kvpool.plan.result import PoolPlan
from kvpool.spec import decode_worst_case_pages, pages_needed, pages_per_group


def graph_padding_pages(plan: PoolPlan, name: str) -> int:
    """Pages one CUDA-graph padded decode can hold in group `name`: the exact
    decode worst case for groups whose need is bounded (a full window), else a
    minimal decode of `1 + d + E` positions."""
    group = plan.spec.group(name)
    worst = decode_worst_case_pages(group, plan.limits.headroom)
    if worst is not None:
        return worst
    shape = minimal_decode(plan.limits)
    return pages_needed(group, shape.capacity, shape.history)


def plan_warnings(plan: PoolPlan) -> tuple[str, ...]:
    """Warnings for a final plan: a group that cannot hold the largest CUDA-graph
    batch of full-window decodes (padding dummies then fail and padded batches run
    eagerly), and a max-length request that does not fit at all."""
    out = []
    graph = plan.limits.largest_graph_batch
    for g in plan.groups:
        per = graph_padding_pages(plan, g.name)
        if graph * per > g.pages:
            out.append(
                f"group '{g.name}' holds {g.pages // per} decodes of {per} page{'s' * (per != 1)} each but the "
                f"largest CUDA-graph batch is {graph}: padded decode batches may not fit and "
                "fall back to eager mode (raise its share or lower the graph batch sizes"
                + (", or drop avg_seq_len)" if plan.limits.avg_seq_len is not None else ")")
            )
    longest = decode_shape(plan.limits.max_seq_len, plan.limits)
    if plan.max_requests(longest) == 0:
        out.append(f"not even one request at max_seq_len {plan.limits.max_seq_len} fits the pools")
    return tuple(out)


def unmet_floor_warnings(plan: PoolPlan, constraints: Sequence[Constraint]) -> tuple[str, ...]:
    """Warnings for the floors an explicit pool ratio opted out of but leaves
    unmet: one per constraint and group whose batch needs more pages than the
    plan gives it, naming the floor and the pages short (the ratio is kept:
    an explicit ratio is the operator's choice, said out loud)."""
    out = []
    for c in constraints:
        need = pages_per_group(plan.spec, c.batch)
        for g in plan.groups:
            if (want := need.get(g.name, 0)) > g.pages:
                out.append(
                    f"pool_ratio leaves the '{c.name}' floor unmet: group '{g.name}' has "
                    f"{g.pages} of the {want} pages it needs ({want - g.pages} pages short); "
                    "that batch will not fit (raise the group's share or drop --pool-ratio)"
                )
    return tuple(out)
