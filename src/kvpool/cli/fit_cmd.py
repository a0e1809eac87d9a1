"""`kvpool fit MODEL --gpu G[xN] [--max-seq-len L | --users N --len L] [--engine E,...|all]`:
will it fit, and how do I launch it?

With `--max-seq-len` (or neither): one layout (N GPUs as tensor parallelism
unless --tp/--pp say otherwise; GPUs left over are data-parallel replicas), the
whole-GPU memory breakdown per rank, and per engine the verdict, its budget flags,
KV per rank, requests that fit, CUDA-graph sizes and the launch line
(cli/fit_engines.py). With `--users N --len L`: the layouts that hold N requests
of L positions at once, ranked (cli/fit_layouts.py), then the engines on the first.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Any

from kvpool import presets
from kvpool.cli import fit_layouts
from kvpool.cli.common import add_json_arg, checked, positive_int, print_json, table
from kvpool.cli.engines_out import launch_model_id
from kvpool.cli.files import output_file, write_output
from kvpool.cli.fit_engines import EngineFit, engine_fit, fit_lengths, render_engine
from kvpool.cli.plan_args import Resolved, add_plan_args, resolve
from kvpool.cli.plan_cmd import render_memory
from kvpool.cli.request import PlanRequest
from kvpool.engines import registry
from kvpool.errors import KvpoolError, SpecError
from kvpool.plan import PoolPlan
from kvpool.spec.loader import check_tp_divides_heads, read_config
from kvpool.units import format_bytes

GPU_COUNT = re.compile(r"(?P<name>.+?)x(?P<count>[1-9][0-9]*)", re.IGNORECASE)
MAX_GPUS = 64


def register(sub: Any) -> None:
    p = sub.add_parser(
        "fit",
        help="will it fit? per engine: verdict, budget flags, requests that fit, CUDA graphs, launch line",
        description="Size a deployment on whole GPUs and answer, per engine (vLLM, SGLang, TensorRT-LLM): "
        "does it start, with which budget flags in that engine's convention, how much KV per rank, how many "
        "requests fit at once, which CUDA-graph batch sizes keep graphs, and the launch line. With --users N "
        "--len L: the layouts (GPU count, TP, PP, replicas) that hold N such requests at once, ranked. "
        "Exit 2 when nothing fits.",
    )
    add_plan_args(p)
    for action in p._actions:  # the same --gpu, with a GPU count
        if action.dest == "gpu":
            action.type = checked(gpu_and_count)
            action.metavar = "NAME[xN]"
            action.help = "GPU preset (kvpool gpus) and count, e.g. h100x2; auto: this machine's GPUs (NVML)"
    f = p.add_argument_group("fit")
    f.add_argument(
        "--engine",
        type=checked(parse_engines),
        default="all",
        metavar="E,...",
        help=f"engines to answer for: {', '.join(registry.NAMES)} or all (default all)",
    )
    f.add_argument("--users", type=positive_int, default=None, metavar="N", help="requests decoding at once")
    f.add_argument("--len", type=positive_int, default=None, metavar="L", help="their length, prompt plus output")
    f.add_argument("--model-id", default=None, metavar="ID", help="model id in the launch lines (default: hub id)")
    f.add_argument(
        "--emit-to",
        type=output_file,
        default=None,
        metavar="FILE",
        help="write the launch of the one --engine to FILE (a shell line, or TensorRT-LLM's YAML)",
    )
    add_json_arg(p)
    p.set_defaults(func=run)


def parse_gpu(text: str | None) -> tuple[str, int]:
    """`h100x2` -> ("h100", 2); `h100` -> ("h100", 1); a preset whose own name
    ends in x<digits> wins over the count."""
    if text is None:
        raise KvpoolError("fit needs --gpu NAME[xN], e.g. --gpu h100x2 (kvpool gpus)")
    if text.lower() == "auto":  # this machine's GPUs, all of them
        from kvpool.presets.detect import detect

        return "auto", detect()[1]
    match = GPU_COUNT.fullmatch(text)
    if match is None or text.lower() in presets.gpu_names():
        return text, 1
    count = int(match["count"])
    if count > MAX_GPUS:
        raise KvpoolError(f"--gpu {text}: at most {MAX_GPUS} GPUs")
    return match["name"], count


def check_implied_tp(model: str, gpu: str, count: int) -> None:
    """One engine over `count` GPUs is tensor-parallel size `count`: refused in
    terms of --gpu (the user gave no --tp) when it does not split the model's
    attention heads, as vLLM and SGLang refuse it."""
    try:
        check_tp_divides_heads(read_config(model)[1], count)
    except SpecError:
        heads = read_config(model)[1].get("num_attention_heads")
        raise KvpoolError(
            f"--gpu {gpu}: one engine over {count} GPUs splits the model's {heads} attention heads {count} ways "
            "(vLLM and SGLang refuse it); give a GPU count that divides them, --tp/--pp for the layout, "
            "or --users N --len L to rank the layouts"
        ) from None


def gpu_and_count(text: str) -> str:
    """`text` if `parse_gpu` reads it and names a GPU preset (`auto` is read later)."""
    if text.lower() != "auto":
        presets.load_gpu(parse_gpu(text)[0])
    return text


def parse_engines(text: str) -> tuple[str, ...]:
    """`all`, or a comma list of ENGINE[@RELEASE]: the engines, by bare name. The
    launch lines follow each engine's newest modelled release, so an older one is refused."""
    names_all = registry.NAMES
    if text.strip().lower() == "all":
        return names_all
    if any(not e.strip() for e in text.split(",")):
        raise KvpoolError(f"--engine {text!r} has an empty item; choose from {', '.join(names_all)} or all")
    names = []
    for item in (e.strip().lower() for e in text.split(",")):
        try:
            engine, release = registry.engine_name(item)
        except KvpoolError:
            raise KvpoolError(f"--engine {text!r}: choose from {', '.join(names_all)} or all") from None
        newest = registry.RELEASES[engine][0]
        if release != newest:
            raise KvpoolError(f"fit states {engine}@{newest}'s launch; {item} is for kvpool plan --engine")
        names.append(engine)
    if not names:
        raise KvpoolError(f"--engine {text!r}: choose from {', '.join(names_all)} or all")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Answer:
    """What `kvpool fit` says: `out` its --json, `text` its screen, `error` the one
    stderr line of an exit 2 (no engine starts, no layout holds the users), else None."""

    out: dict[str, Any]
    text: str
    error: str | None


def run(args: argparse.Namespace) -> int:
    found = answer(args)
    if args.json:
        print_json(found.out)
    else:
        print(found.text)
    if found.error is not None:
        print(f"kvpool fit: {found.error}", file=sys.stderr)
        return 2
    return 0


def answer(args: argparse.Namespace) -> Answer:
    """The fit the options ask for (the CLI prints it, `kvpool serve` returns it)."""
    gpu, count = parse_gpu(args.gpu)
    engines = parse_engines(args.engine)
    if args.emit_to is not None and len(engines) != 1:
        raise KvpoolError("--emit-to writes one engine's launch: give one --engine")
    if (args.users is None) != (args.len is None):
        raise KvpoolError("give --users N and --len L together")
    if args.users is not None and args.max_seq_len is not None:
        raise KvpoolError("--len is the max_seq_len of --users: drop --max-seq-len")
    layout = [flag for flag, value in (("--tp", args.tp), ("--pp", args.pp), ("--dp", args.dp)) if value != 1]
    if args.users is not None and layout:  # they were silently replaced by each ranked layout's own
        raise KvpoolError(
            f"--users N --len L ranks the layouts (tp, pp, replicas) itself: drop {' / '.join(layout)}, "
            "or give --max-seq-len instead to size that one layout"
        )
    args = argparse.Namespace(**{**vars(args), "gpu": gpu, "gpu_text": args.gpu})
    request = PlanRequest.from_args(args)
    if args.users is not None:
        return answer_users(args, request, gpu, count, engines)
    tp, pp = request.model.tp, request.model.pp
    if count > 1 and tp == 1 and pp == 1:
        tp = count  # N GPUs: one engine over all of them
        check_implied_tp(args.model, args.gpu_text, count)
    if count % (tp * pp):
        raise KvpoolError(f"--tp {tp} x --pp {pp} does not divide {count} GPUs")
    request = dataclasses.replace(request, model=dataclasses.replace(request.model, tp=tp))
    resolved = resolve(request, gpu_only_for_budget=False)  # --gpu also counts the GPUs
    plan = resolved.plan()
    fits = answer_engines(args, resolved, plan, engines, None)
    out = {
        "model": resolved.spec.name,
        "gpu": resolved_gpu(gpu),
        "gpus": count,
        "layout": {"tp": tp, "pp": pp, "replicas": count // (tp * pp)},
        **summary(resolved),
        "pools": pools_json(plan),
        "engines": [f.to_json() for f in fits],
    }
    finish(args, out, fits)
    text = header(resolved, gpu, count, count // (tp * pp)) + "\n" + "\n\n".join(render_engine(f) for f in fits)
    error = None if any(f.starts for f in fits) else f"no engine starts: {fits[0].reasons[0]}"
    return Answer(out, text, error)


def answer_users(
    args: argparse.Namespace, request: PlanRequest, gpu: str, count: int, engines: tuple[str, ...]
) -> Answer:
    users, length = args.users, args.len
    max_gpus = count if count > 1 else MAX_GPUS
    layouts = fit_layouts.search(request.model, request.budget, request.limits, users, length, max_gpus)
    good = fit_layouts.ranked(layouts, users)
    best = good[0] if good else None
    fits: list[EngineFit] = []
    out: dict[str, Any] = {
        "model": request.model.model,
        "gpu": resolved_gpu(gpu),
        "users": users,
        "len": length,
        "layouts": [x.to_json() for x in good],
        "tried": [x.to_json() for x in layouts if x not in good],
    }
    if best is not None and best.resolved is not None:
        plan = best.resolved.plan()
        fits = answer_engines(args, best.resolved, plan, engines, length)
        out.update(summary(best.resolved), pools=pools_json(plan))
    out["engines"] = [f.to_json() for f in fits]
    finish(args, out, fits)
    lines = [render_layouts(good, layouts, users, length, resolved_gpu(gpu))]
    if fits and best is not None:
        lines.append(f"\nper replica of the first layout ({best.replicas} x tp {best.tp}):\n")
        lines.append("\n\n".join(render_engine(f) for f in fits))
    error = None if best else f"no layout up to {max_gpus} GPUs holds {users} requests of {length} positions"
    return Answer(out, "\n".join(lines), error)


def pools_json(plan: PoolPlan) -> list[dict[str, Any]]:
    """kvpool's split of the KV budget between the model's page pools."""
    return [
        {
            "name": g.name,
            "kind": g.kind,
            "page_bytes": g.page_bytes,
            "pages": g.pages,
            "bytes": g.bytes,
            "share": g.share,
        }
        for g in plan.groups
    ]


def answer_engines(
    args: argparse.Namespace, resolved: Resolved, plan: PoolPlan, engines: tuple[str, ...], length: int | None
) -> list[EngineFit]:
    """Each engine's answer on `plan`, the plan of `resolved`."""
    model_id = launch_model_id(plan, resolved.request.model.model, args.model_id)
    lengths = fit_lengths(plan, length)
    parallel = resolved.request.model.parallel
    return [engine_fit(e, plan, model_id, resolved.budget.memory, lengths, parallel) for e in engines]


def summary(resolved: Resolved) -> dict[str, Any]:
    lim, memory = resolved.limits, resolved.budget.memory
    return {
        "limits": {
            "max_seq_len": lim.max_seq_len,
            "max_batch_size": lim.max_batch_size,
            "max_num_tokens": lim.max_num_tokens,
        },
        "kv_bytes_per_rank": resolved.budget.kv_bytes,
        "memory": None if memory is None else memory.to_json(),
    }


def finish(args: argparse.Namespace, out: dict[str, Any], fits: list[EngineFit]) -> None:
    """--emit-to FILE: the one engine's launch, written whole or not at all."""
    if args.emit_to is None:
        return
    if not fits:
        raise KvpoolError("nothing to emit: no layout holds the requests")
    if fits[0].emitted is None:
        raise KvpoolError(f"nothing to emit: {fits[0].reasons[0]}")
    path = write_output(args.emit_to, fits[0].emitted.text() + "\n", "--emit-to")
    out["emitted_to"] = str(path)
    print(f"kvpool fit: wrote the {fits[0].engine} launch to {path}", file=sys.stderr)


def resolved_gpu(gpu: str) -> str:
    return presets.load_gpu(gpu).name


def header(resolved: Resolved, gpu: str, count: int, replicas: int) -> str:
    lim, memory, model = resolved.limits, resolved.budget.memory, resolved.request.model
    head = (
        f"{resolved.spec.name} on {count} x {resolved_gpu(gpu)} ({model.layout()}"
        + (f", {replicas} replicas" if replicas > 1 else "")
        + f"): max_seq_len {lim.max_seq_len:,}, max_num_seqs {lim.max_batch_size}, "
        f"max_num_batched_tokens {lim.max_num_tokens or '-'}"
    )
    if memory is None:
        return f"{head}\nKV per rank: {format_bytes(resolved.budget.kv_bytes)} ({resolved.budget.how})\n"
    return head + "\n" + render_memory(memory, gpu, model.layout())


def render_layouts(
    good: list[fit_layouts.Layout], tried: list[fit_layouts.Layout], users: int, length: int, gpu: str
) -> str:
    head = f"layouts of {gpu} that hold {users} requests of {length:,} positions at once (fewest GPUs first):"
    if not good:
        closest = max(tried, key=lambda x: x.holds, default=None)
        more = (
            ""
            if closest is None
            else f"; the most any holds: {closest.holds} ({closest.gpus} GPUs, tp {closest.tp}, pp {closest.pp})"
        )
        return f"{head}\nnone{more}"
    rows = [
        [
            x.gpus,
            x.tp,
            x.pp,
            x.replicas,
            format_bytes(x.kv_bytes),
            x.per_replica,
            x.holds,
            f"{x.holds / users - 1:+.0%}",
        ]
        for x in good[:12]
    ]
    smaller = [x for x in tried if x.gpus < good[0].gpus]
    lines = [head, table(["GPUs", "TP", "PP", "replicas", "KV per rank", "per replica", "held", "headroom"], rows)]
    if smaller:
        most = max(smaller, key=lambda x: x.holds)
        why = f": {most.reason}" if most.reason and not most.holds else f" ({most.holds} held)"
        lines.append(f"fewer GPUs fall short; the closest is {most.gpus} GPUs, tp {most.tp}, pp {most.pp}{why}")
    return "\n".join(lines)
