"""`kvpool plan MODEL ...`: split a KV budget between a model's page pools."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from kvpool.cli import engines_out, tiers_args
from kvpool.cli.common import add_json_arg, concurrency_text, print_json, table
from kvpool.cli.plan_args import Resolved, add_plan_args, resolve
from kvpool.cli.request import PlanRequest
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.plan.memory import MemoryBudget
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
        rate = float(text)
    except ValueError:
        rate = math.nan
    if text.strip().lower() != "trace" and not rate > 0:  # nan and -inf fail too
        raise argparse.ArgumentTypeError(f"expected requests/s > 0, inf or trace; got {text!r}")
    return text


def render(plan: PoolPlan) -> str:
    """The plan as text: a header, one row per pool, constraints, concurrency, warnings."""
    lim = plan.limits
    # a missed guarantee (the engine's warmup, a request at max_seq_len) is said first
    first = 1 if any(not c.satisfied for c in plan.guarantees) else 0
    lines = [
        f"{plan.spec.name}: {format_bytes(plan.total_bytes)} of {format_bytes(plan.budget_bytes)} "
        f"in {len(plan.groups)} pool{'' if len(plan.groups) == 1 else 's'} (policy {plan.policy}, "
        f"phase {plan.phase}, {plan.spec.tokens_per_block} tokens per page)",
        f"limits: max_batch_size {lim.max_batch_size}, max_seq_len {lim.max_seq_len}, max_num_tokens "
        f"{lim.max_num_tokens or 'none'}, draft_len {lim.max_draft_len}, extra_kv_tokens "
        f"{lim.num_extra_kv_tokens}, avg_seq_len {plan.avg_seq_len or 'not given'}",
        *(f"warning: {w}" for w in plan.warnings[:first]),
        "",
        table(
            ["group", "kind", "window", "page bytes", "pages", "bytes", "share"],
            [
                [
                    g.name,
                    g.kind,
                    g.window,
                    f"{g.page_bytes:,}",
                    f"{g.pages:,}",
                    format_bytes(g.bytes),
                    f"{100 * g.share:.1f}%",
                ]
                for g in plan.groups
            ],
        ),
    ]
    if plan.typical_step:
        step = plan.typical_step
        lines.append(
            f"\ntypical step: {step[0].capacity}/{step[0].history}"
            + (f" + {len(step) - 1} x {step[1].capacity}/{step[1].history}" if len(step) > 1 else "")
            + " (capacity/history)"
        )
    for c in plan.constraints:
        state = "fits" if c.satisfied else f"short {dict(c.short)}"
        if c.shrunk_from is not None:
            state += f" after shrinking its longest request from {c.shrunk_from.capacity}"
        lines.append(
            f"constraint {c.name}: {len(c.batch)} requests, longest "
            f"{max(s.capacity for s in c.batch)} positions: {state}"
        )
    conc = concurrency_text(plan.max_concurrency(), lim.max_seq_len, plan.avg_seq_len)
    lines.append(f"\nrequests that fit at once: {conc}")
    lines += [f"warning: {w}" for w in plan.warnings[first:]]
    lines += [f"note: {n}" for n in plan.notes if not n.startswith("fit:")]
    return "\n".join(lines)


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
    request = PlanRequest.from_args(args)
    resolved = resolve(request, gpu_only_for_budget=args.sizing != "tuned")  # tuned times steps on --gpu
    plan = sized_plan(args, resolved)
    if request.fit and not plan.max_concurrency()["max_seq_len"]:
        # --fit promises a usable plan: one that holds no request of max_seq_len is not one
        shrunk = [max(b.capacity for b in c.batch) for c in plan.constraints if c.shrunk_from is not None]
        hint = f"--max-seq-len {min(shrunk)}" if shrunk else "a lower --max-seq-len"
        raise KvpoolError(
            f"--fit: {format_bytes(plan.budget_bytes)} of KV holds no request of max_seq_len "
            f"{plan.limits.max_seq_len:,}; give {hint} (the longest its constraints fit) or more memory"
        )
    memory = resolved.budget.memory
    tiers_args.check_dependent(args)
    tiers = tiers_args.tiers_from_args(args, plan)
    report, emitted = engines_out.engine_outputs(args, plan, memory, tiers)
    capped = default_length_note(request, plan)
    if args.json:
        out = engines_out.to_json(report, emitted, plan)
        if capped and isinstance(out.get("notes"), list):
            out["notes"].append(capped)
        if memory is not None and emitted is None:
            out["memory"] = memory.to_json()
        if tiers:
            out["tiers"] = [t.to_json() for t in tiers]
        print_json(out)
        return 0
    # --emit: the launch alone on stdout (`> launch.sh`, `> kvpool.yaml` give a file the
    # engine reads); the tables that explain it go to stderr
    info = sys.stderr if emitted is not None else sys.stdout
    if memory is not None:
        print(render_memory(memory, str(request.budget.gpu), request.model.layout()), file=info)
    print(render(plan), file=info)
    if tiers:
        print("\n" + tiers_args.render(tiers), file=info)
    if capped:
        print(f"note: {capped}", file=info)
    if report is not None:
        print("\n" + engines_out.render(report, None, plan), file=info)
    if emitted is not None:
        print(f"\n{emitted.engine} launch that follows the plan (on stdout):", file=info)
        info.flush()
        print(emitted.text())
    return 0


def sized_plan(args: argparse.Namespace, resolved: Resolved) -> PoolPlan:
    """The plan of the --sizing policy asked for (workload: the plain plan)."""
    # a flag that means nothing without the one it depends on is refused, not ignored
    if args.sizing != "tuned":
        for given, name in ((args.sim_gpu, "--sim-gpu"), (args.workload_rate, "--workload-rate")):
            if given is not None:
                raise KvpoolError(f"{name} is for --sizing tuned (the other sizings time no steps)")
    if args.sizing != "workload":
        from kvpool.cli.plan_sizing import adaptive_plan

        return adaptive_plan(resolved, args.sizing, args.sim_gpu, args.workload_rate or "inf")
    return resolved.plan()


def default_length_note(request: PlanRequest, plan: PoolPlan) -> str | None:
    """Why L is below the model's positions when --max-seq-len was not given."""
    max_pos, length = plan.spec.max_position_embeddings, plan.limits.max_seq_len
    if request.limits.max_seq_len is not None or not max_pos or max_pos <= length:
        return None
    return (
        f"max_seq_len defaults to {length:,}, below the model's {max_pos:,} positions: planning every request "
        f"at full context would reserve pages most deployments never use; give --max-seq-len {max_pos} for it"
    )
