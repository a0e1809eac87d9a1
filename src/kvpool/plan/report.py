"""Warnings about a finished plan: what it cannot hold that the engine will ask for."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.plan.batches import Constraint, decode_shape, minimal_decode
from kvpool.plan.capture import WarmupReport
from kvpool.plan.limits import ServingLimits
from kvpool.plan.plan_pages import plan_warmup
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


def spans(selected: Sequence[int], sizes: Sequence[int]) -> str:
    """The `selected` graph batch sizes as runs over the listed `sizes`, e.g.
    "1..64, 96" ("all 35 (1..256)" when nothing is left out)."""
    chosen = set(selected)
    if not chosen:
        return "none"
    runs: list[list[int]] = []
    for i, b in enumerate(sizes):
        if b in chosen:
            if runs and i > 0 and sizes[i - 1] == runs[-1][-1]:
                runs[-1].append(b)
            else:
                runs.append([b])
    text = ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"all {len(sizes)} ({text})" if chosen >= set(sizes) else text


def window_decodes_below_graph(plan: PoolPlan) -> dict[str, tuple[int, int]]:
    """Groups with a bounded decode need (a full window) whose pages hold fewer
    such decodes than the largest CUDA-graph batch: name -> (decodes held,
    pages per decode)."""
    out = {}
    for g in plan.groups:
        per = decode_worst_case_pages(plan.spec.group(g.name), plan.limits.headroom)
        if per is not None and plan.limits.largest_graph_batch * per > g.pages:
            out[g.name] = (g.pages // per, per)
    return out


def _draft_warnings(report: WarmupReport, d: int, sizes: Sequence[int], tail: str) -> list[str]:
    """The graph sizes of draft length `d` that cannot be captured, and its padding dummy without pages."""
    out = []
    safe = [b for b, dd in report.captured if dd == d]
    skipped = [s for s in report.skipped if s.draft_len == d]
    if skipped:
        worst = max(skipped, key=lambda s: s.short_pages)
        out.append(
            f"CUDA-graph batch sizes {spans([s.batch_size for s in skipped], sizes)} (draft {d}) cannot be captured: "
            f"group '{worst.group}' is up to {worst.short_pages} pages short, so those batches run eagerly; "
            f"safe sizes: {spans(safe, sizes)} (raise its share or lower the graph batch sizes" + tail
        )
    if d in report.padding_short:
        out.append(
            f"no pages for the draft-{d} padding dummy (short {dict(report.padding_short[d])}): padded batches "
            "of that draft length run eagerly"
        )
    return out


def graph_warnings(plan: PoolPlan, *, unfit: bool = True) -> list[str]:
    """What the CUDA-graph warmup on this plan's pages finds (`plan_warmup`, the
    computation `kvpool warmup` runs on the manager): sizes it cannot capture,
    a padding dummy without pages, a warmup shape that does not fit, and groups
    that hold fewer full-window decodes than the largest graph batch. Each
    graph warning names the sizes that are safe (captured). `unfit=False` leaves
    out the warmup shapes that do not fit (a plan's guarantees report them)."""
    report = plan_warmup(plan)
    limits = plan.limits
    sizes = limits.graph_batch_sizes
    tail = ", or drop avg_seq_len)" if limits.avg_seq_len is not None else ")"
    out = [w for d in sorted(report.padding) for w in _draft_warnings(report, d, sizes, tail)]
    for name, short in report.unfit.items() if unfit else ():
        out.append(f"warmup shape '{name}' does not fit (short {dict(short)}): the engine's warmup would fail")
    graph = limits.largest_graph_batch
    safe0 = [b for b, d in report.captured if d == limits.max_draft_len]
    for name, (held, per) in window_decodes_below_graph(plan).items():
        out.append(
            f"group '{name}' holds {held} decodes of {per} page{'s' * (per != 1)} each (a full window) but the "
            f"largest CUDA-graph batch is {graph}: batches above {held} form only from requests shorter than "
            "its window, and an engine that allocates its padding dummy per step falls back to eager mode when "
            f"the pool is full; kvpool's warmup captures sizes {spans(safe0, sizes)} with a reserved padding dummy "
            "(raise its share or lower the graph batch sizes" + tail
        )
    return out


def plan_warnings(plan: PoolPlan, *, guarantees: bool = True) -> tuple[str, ...]:
    """Warnings for a final plan: the CUDA-graph findings of `graph_warnings`,
    and a max-length request that does not fit at all. `guarantees=False`
    leaves out what `guarantee_warnings` says (a warmup shape that does not
    fit, no request at max_seq_len)."""
    out = graph_warnings(plan, unfit=guarantees)
    longest = decode_shape(plan.limits.max_seq_len, plan.limits)
    if guarantees and plan.max_requests(longest) == 0:
        out.append(f"not even one request at max_seq_len {plan.limits.max_seq_len} fits the pools")
    return tuple(out)


def guarantee_text(name: str, limits: ServingLimits) -> str:
    """What a guarantee (`batches.guarantees`) holds, in words."""
    if name == "max_seq_len":
        return f"one request at max_seq_len {limits.max_seq_len}"
    if name == "warmup_batch":
        return f"the engine's warmup batch of {limits.max_batch_size} minimal decodes"
    return f"the engine's context warmup of {(limits.max_num_tokens or 0) + limits.headroom} positions"


def guarantee_warnings(plan: PoolPlan) -> tuple[str, ...]:
    """One warning for the guarantees a plan misses (none when it holds them all):
    each missed one with the pages it lacks, what that breaks, and the smallest
    single changes that would hold them all (`plan.advice`, each re-planned)."""
    missed = [c for c in plan.guarantees if not c.satisfied]
    if not missed:
        return ()
    limits = plan.limits
    parts = [f"{guarantee_text(c.name, limits)} (short {dict(c.short)})" for c in missed]
    breaks = (
        "the engine's warmup would fail"
        if any(c.name != "max_seq_len" for c in missed)
        else "a request that long can never run"
    )
    changes = plan.advice.changes(limits, plan.budget_bytes) if plan.advice is not None else []
    fix = f"the smallest change that holds {'it' if len(missed) == 1 else 'them'}: {' or '.join(changes)}"
    return (f"the pools cannot hold {' and '.join(parts)}: {breaks}; {fix if changes else 'no single change would'}",)


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
