"""`kvpool plan MODEL ...`: split a KV budget between a model's page pools."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvpool import deploy
from kvpool.cli import engines_out, tiers_args
from kvpool.cli.common import add_json_arg, concurrency_text, print_json, say_fallback, table
from kvpool.cli.plan_args import add_plan_args, plan_keywords
from kvpool.deploy.adaptive import arrival_rate
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.result import ConstraintResult
from kvpool.units import format_bytes


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="split a KV memory budget between a model's page pools",
        description="Split a KV memory budget between the page pools of a model, check the "
        "batches that must fit, and report how many requests fit at once. "
        "Exit code 2 (one line on stderr) when a constraint does not fit.",
    )
    add_plan_args(p)
    engines_out.add_engine_args(p)
    tiers_args.add_tier_args(p)
    w = p.add_argument_group("workload sizing (with --workload TRACE)")
    w.add_argument(
        "--sizing",
        choices=("workload", "occupancy", "tuned"),
        default="workload",
        help="workload (default): expected decode pages over the trace's lengths; "
        "occupancy: pages over each request's time in flight, prefill chunks "
        "included; tuned: a bounded search over the split, simulated on a "
        "1,000-request sample of the trace and checked on two other parts of it; "
        "the reference split unless a candidate is faster everywhere (needs a GPU for step times)",
    )
    w.add_argument(
        "--sim-gpu", default=None, metavar="NAME", help="GPU whose step times --sizing tuned simulates (default: --gpu)"
    )
    w.add_argument(
        "--workload-rate",
        type=workload_rate,
        default=None,
        metavar="R",
        help="arrival rate the tuned search replays the sample at (default inf: "
        "offline; 'trace' for the trace's own times)",
    )
    add_json_arg(p)
    p.set_defaults(func=run)


def workload_rate(text: str) -> str:
    """An argparse type: requests/s > 0 (inf: offline) or `trace`."""
    try:
        arrival_rate(text)
    except KvpoolError:
        raise argparse.ArgumentTypeError(f"expected requests/s > 0, inf or trace; got {text!r}") from None
    return text


def header(plan: PoolPlan) -> list[str]:
    """The plan's first two lines: what it holds, and the limits it holds them for."""
    lim = plan.limits
    pools = "pool" if len(plan.groups) == 1 else "pools"
    return [
        f"{plan.spec.name}: {format_bytes(plan.total_bytes)} of {format_bytes(plan.budget_bytes)} "
        f"in {len(plan.groups)} {pools} (policy {plan.policy}, phase {plan.phase}, "
        f"{plan.spec.tokens_per_block} tokens per page)",
        f"limits: max_batch_size {lim.max_batch_size}, max_seq_len {lim.max_seq_len}, max_num_tokens "
        f"{lim.max_num_tokens or 'none'}, draft_len {lim.max_draft_len}, extra_kv_tokens "
        f"{lim.num_extra_kv_tokens}, avg_seq_len {plan.avg_seq_len or 'not given'}",
    ]


def render(plan: PoolPlan) -> str:
    """The plan as text: a header, one row per pool, constraints, concurrency, warnings."""
    lim = plan.limits
    # a missed guarantee (the engine's warmup, a request at max_seq_len) is said first
    first = 1 if any(not c.satisfied for c in plan.guarantees) else 0
    lines = [
        *header(plan),
        *(f"warning: {w}" for w in plan.warnings[:first]),
        "",
        pools_table(plan),
        *typical_step(plan),
        *(constraint_line(c) for c in plan.constraints),
        f"\nrequests that fit at once: {concurrency_text(plan.max_concurrency(), lim.max_seq_len, plan.avg_seq_len)}",
    ]
    lines += [f"warning: {w}" for w in plan.warnings[first:]]
    lines += [f"note: {n}" for n in plan.notes if not n.startswith("fit:")]
    return "\n".join(lines)


def pools_table(plan: PoolPlan) -> str:
    rows = [
        [g.name, g.kind, g.window, f"{g.page_bytes:,}", f"{g.pages:,}", format_bytes(g.bytes), f"{100 * g.share:.1f}%"]
        for g in plan.groups
    ]
    return table(["group", "kind", "window", "page bytes", "pages", "bytes", "share"], rows)


def typical_step(plan: PoolPlan) -> list[str]:
    """The typical step's shapes (capacity/history), when the plan has one."""
    step = plan.typical_step
    if not step:
        return []
    rest = f" + {len(step) - 1} x {step[1].capacity}/{step[1].history}" if len(step) > 1 else ""
    return [f"\ntypical step: {step[0].capacity}/{step[0].history}{rest} (capacity/history)"]


def constraint_line(c: ConstraintResult) -> str:
    state = "fits" if c.satisfied else f"short {dict(c.short)}"
    if c.shrunk_from is not None:
        state += f" after shrinking its longest request from {c.shrunk_from.capacity}"
    return (
        f"constraint {c.name}: {len(c.batch)} requests, longest {max(s.capacity for s in c.batch)} positions: {state}"
    )


def render_memory(memory: MemoryBudget, gpu: str, layout: str) -> str:
    """The whole-GPU breakdown of one rank: a table of what is subtracted from the usable memory."""
    rows = [
        [f"{gpu} x {memory.utilization:g}", format_bytes(memory.usable_bytes), "utilization of the device's memory"],
        ["- weights", format_bytes(memory.weights_bytes), memory.how["weights"]],
        ["- activations", format_bytes(memory.activation_bytes), memory.how["activation"]],
        ["- CUDA graphs", format_bytes(memory.cuda_graph_bytes), memory.how["cuda_graph"]],
        ["- reserved", format_bytes(memory.reserved_bytes), memory.how["reserved"]],
        ["= KV cache", format_bytes(memory.kv_bytes), ""],
    ]
    head = (
        f"memory per rank ({layout}; utilization {memory.utilization:g} of the GPU's memory, "
        "vLLM's gpu_memory_utilization convention):"
    )
    return head + "\n" + table(["part", "bytes", "from"], rows) + "\n"


def run(args: argparse.Namespace) -> int:
    found = deploy.plan(
        args.model,
        **plan_keywords(args),
        gpu=args.gpu,
        engine=args.engine,
        emit=args.emit,
        model_id=args.model_id,
        block_size=args.block_size,
        async_scheduling=args.async_scheduling,
        sizing=args.sizing,
        sim_gpu=args.sim_gpu,
        workload_rate=args.workload_rate,
        host_memory=args.host_memory,
        disk=args.disk,
        host_rule=args.host_rule,
        ranks_per_node=args.ranks_per_node,
    )
    say_fallback(found.plan.spec)
    if args.json:
        print_json(found.to_dict())
        return 0
    # --emit: the launch alone on stdout (`> launch.sh`, `> kvpool.yaml` give a file the
    # engine reads); the tables that explain it go to stderr
    emitted, memory = found.emitted, found.memory
    info = sys.stderr if emitted is not None else sys.stdout
    if memory is not None:
        request = found.resolved.request
        print(render_memory(memory, str(request.budget.gpu), request.model.layout()), file=info)
    print(render(found.plan), file=info)
    if found.tiers:
        print("\n" + tiers_args.render(list(found.tiers)), file=info)
    if found.length_note:
        print(f"note: {found.length_note}", file=info)
    if found.report is not None:
        print("\n" + engines_out.render(found.report, None, found.plan), file=info)
    if emitted is not None:
        print(f"\n{emitted.engine} launch that follows the plan (on stdout):", file=info)
        info.flush()
        print(emitted.text())
    return 0
