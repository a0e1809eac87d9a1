"""`kvpool fit MODEL --gpu G[xN] [--max-seq-len L | --users N --len L] [--engine E,...|all]`:
will it fit, and how do I launch it? The answer is `kvpool.deploy.fit`'s; this
module reads the options and prints it (docs/fit.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvpool import deploy
from kvpool.cli.common import add_json_arg, checked, positive_int, print_json, say_fallback, table
from kvpool.cli.files import check_input, check_output, output_file, write_output
from kvpool.cli.fleet_output import SEARCH_DEFAULTS, add_search_args, render_fit
from kvpool.cli.plan_args import add_plan_args, plan_keywords
from kvpool.cli.plan_cmd import render_memory
from kvpool.cli.tiers_args import add_tier_args
from kvpool.deploy.engine_fit import EngineFit
from kvpool.deploy.fitting import FitResult, Search, parse_engines
from kvpool.deploy.fleet_fit import FleetFit, fit_fleet
from kvpool.deploy.layouts import Layout
from kvpool.engines import registry
from kvpool.errors import KvpoolError, flagged
from kvpool.media import Medium
from kvpool.plan.tiers import TierPlan
from kvpool.units import format_bytes


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
    add_tier_args(p, title="cold tiers below each engine's pools (docs/tiers.md)", engine_rules=True)
    add_search_args(p)
    add_json_arg(p)
    p.set_defaults(func=run)


def fit_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """`deploy.fit`'s keywords from the options."""
    if args.gpu is None:
        raise KvpoolError("fit needs --gpu NAME[xN], e.g. --gpu h100x2 (kvpool gpus)")
    return {
        **plan_keywords(args),
        "gpu": args.gpu,
        "engines": args.engine,
        "users": args.users,
        "length": args.len,
        "model_id": args.model_id,
        **{k: getattr(args, k) for k in ("host_memory", "disk", "host_rule", "ranks_per_node")},
    }


def run(args: argparse.Namespace) -> int:
    if args.slo is not None or args.trace is not None:
        return run_search(args)
    check_fit_flags(args)
    found = deploy.fit(args.model, **fit_keywords(args))
    if found.resolved is not None:
        say_fallback(found.resolved.spec)
    out = found.to_dict()
    if args.emit_to is not None:
        out["emitted_to"] = str(emit_to(args.emit_to, found.engines))
    if args.json:
        print_json(out)
    else:
        print(render(found))
    if found.error is not None:
        print(f"kvpool fit: {found.error}", file=sys.stderr)
        return 2
    return 0


def check_fit_flags(args: argparse.Namespace) -> None:
    """The one-engine fit's flags checked before it runs: no fleet-search
    flag, one --engine for --emit-to."""
    for key, default in SEARCH_DEFAULTS.items():
        if getattr(args, key) != default:
            flag = "--" + key.replace("_", "-")
            raise KvpoolError(f"{flag} is the fleet search's: add --trace T --slo S (or drop {flag})")
    if args.emit_to is not None and len(parse_engines(args.engine)) != 1:
        raise KvpoolError("--emit-to writes one engine's launch: give one --engine")


SEARCH_ONLY = ("users", "len", "emit_to", "model_id", "host_memory", "disk")


def run_search(args: argparse.Namespace) -> int:
    """--trace T --slo S: the smallest fleet that meets S on T (`deploy.fit_fleet`)."""
    from kvpool.cli.sim_output import parse_rate

    check_search_flags(args)
    calibration = args.calibration
    if calibration not in (None, "roofline"):
        calibration = check_input(calibration, "calibration ")
    routers = tuple(r.strip() for r in args.routers.split(",") if r.strip())
    found = fit_fleet(
        args.model,
        **plan_keywords(args),
        gpu=args.gpu,
        trace=args.trace,
        slo=args.slo,
        max_gpus=args.max_gpus,
        routers=routers,
        disaggregated=not args.no_disaggregated,
        link=args.link,
        workers=args.workers,
        ray_address=args.ray_address,
        progress=not args.quiet and not args.json,
        rate=parse_rate(args.rate),
        max_requests=args.max_requests,
        calibration=calibration,
    )
    if args.plot:
        write_goodput_plot(args, found)
    if args.json:
        print_json(found.to_dict())
    else:
        print(render_fit(found))
    if found.best is None:
        print(f"kvpool fit: no fleet of at most {args.max_gpus} GPUs meets {found.slo}", file=sys.stderr)
        return 2
    return 0


def check_search_flags(args: argparse.Namespace) -> None:
    """The fleet search's flags checked before any run: --trace and --slo
    both, --gpu, no one-engine flag, a --plot file that can be written."""
    if args.slo is None or args.trace is None:
        raise KvpoolError("the fleet search needs both --trace and --slo (e.g. --slo ttft_p99=2s,itl_p99=50ms)")
    if args.gpu is None:
        raise KvpoolError("fit --slo needs --gpu NAME (the search picks how many)")
    given = [f"--{k.replace('_', '-')}" for k in SEARCH_ONLY if getattr(args, k) not in (None, False)]
    if given:
        raise KvpoolError(f"{', '.join(given)} answer the one-engine fit; drop them with --slo")
    if args.plot is not None:
        from kvpool.sim.plot import check_target

        with flagged("--plot"):
            check_output(args.plot)
        check_target(args.plot)


def write_goodput_plot(args: argparse.Namespace, found: FleetFit) -> None:
    """--plot FILE: the best goodput found at each GPU count."""
    from kvpool.fleet.plot import plot_goodput
    from kvpool.sim.plot import plot_format

    points, fmt, title = found.goodput_by_gpus(), plot_format(args.plot), f"{args.model} on {args.gpu}"
    write_output(args.plot, lambda f: plot_goodput(f, points, slo=str(found.slo), title=title, fmt=fmt), "--plot")


def emit_to(path: Path, fits: tuple[EngineFit, ...]) -> Path:
    """--emit-to FILE: the one engine's launch, written whole or not at all."""
    if not fits:
        raise KvpoolError("nothing to emit: no layout holds the requests")
    if fits[0].emitted is None:
        raise KvpoolError(f"nothing to emit: {fits[0].reasons[0]}")
    path = write_output(path, fits[0].emitted.text() + "\n", "--emit-to")
    print(f"kvpool fit: wrote the {fits[0].engine} launch to {path}", file=sys.stderr)
    return path


def render(found: FitResult) -> str:
    """The screen: the layout and its memory, then a few lines per engine (or,
    with --users, the layouts first and the engines on the first of them)."""
    engines = "\n\n".join(render_engine(f) for f in found.engines)
    if found.search is None:
        return header(found) + "\n" + engines
    s, best = found.search, found.search.best
    lines = [render_layouts(s, found.gpu)]
    if found.engines and best is not None:
        lines += [f"\nper replica of the first layout ({best.replicas} x tp {best.tp}):\n", engines]
    return "\n".join(lines)


def header(found: FitResult) -> str:
    resolved = found.resolved
    assert resolved is not None
    lim, memory, model = resolved.limits, resolved.budget.memory, resolved.request.model
    replicas = resolved.request.replicas
    head = (
        f"{resolved.spec.name} on {found.count} x {found.gpu} ({model.layout()}"
        + (f", {replicas} replicas" if replicas > 1 else "")
        + f"): max_seq_len {lim.max_seq_len:,}, max_num_seqs {lim.max_batch_size}, "
        f"max_num_batched_tokens {lim.max_num_tokens or '-'}"
    )
    if memory is None:
        return f"{head}\nKV per rank: {format_bytes(resolved.budget.kv_bytes)} ({resolved.budget.how})\n"
    return head + "\n" + render_memory(memory, str(resolved.request.budget.gpu), model.layout())


def render_engine(fit: EngineFit) -> str:
    """A few lines: verdict, budget flags, KV, requests, graphs, launch."""
    name = registry.entry(fit.engine).title
    if fit.emitted is None:
        return f"{name}: NOT MODELLED: {'; '.join(fit.reasons)}"
    verdict = "starts" if fit.starts else "REFUSES: " + "; ".join(fit.reasons)
    fits = ", ".join(f"{fit.lengths[n]:,} tokens ({n.replace('_', ' ')}): {v}" for n, v in fit.fits.items())
    lines = [
        f"{name} ({fit.emitted.report.version_modelled}): {verdict}",
        f"  budget: {' | '.join(fit.budget_flags) or 'give --gpu alone for the fraction'}"
        f"  (KV {format_bytes(fit.kv_bytes)} per rank)",
        *(
            []
            if fit.own_default is None
            else [f"  by its own defaults: KV {format_bytes(fit.own_default[0])} per rank ({fit.own_default[1]})"]
        ),
        f"  requests that fit at once: {fits}",
        f"  CUDA graphs: {fit.graph_note.split(': ', 1)[1]}",
        *(f"  {tier_line(t)}" for t in fit.tiers),
        "  launch: " + fit.emitted.text().replace("\n", "\n    "),
    ]
    return "\n".join(lines)


def tier_line(tier: TierPlan) -> str:
    """`host tier: 32.00 GiB per rank (rule), 1,234 full pages`."""
    pages = ", ".join(f"{n:,} {g}" for g, n in tier.pages.items())
    medium = "host tier" if tier.medium == Medium.CPU else "disk tier"
    return f"{medium}: {format_bytes(tier.bytes)} per rank ({tier.rule}), pages {pages}"


def render_layouts(search: Search, gpu: str) -> str:
    """The layouts that hold the users (at most 12), and what falls short, closest."""
    head = (
        f"layouts of up to {search.max_gpus} {gpu} that hold {search.users} requests of {search.length:,} positions "
        "at once (fewest GPUs first):"
    )
    closest = search.closest
    if not search.layouts:
        more = "" if closest is None else f"; the most any holds: {closest.holds} ({where(closest)}){why(closest)}"
        return f"{head}\nnone{more}"
    rows = [
        [x.gpus, x.tp, x.pp, x.replicas, format_bytes(x.kv_bytes), x.per_replica, x.holds, headroom(x, search.users)]
        for x in search.layouts[:12]
    ]
    lines = [head, table(["GPUs", "TP", "PP", "replicas", "KV per rank", "per replica", "held", "headroom"], rows)]
    if closest is not None:
        held = why(closest) or f" ({closest.holds} held)"
        lines.append(f"fewer GPUs fall short; the closest is {where(closest)}{held}")
    return "\n".join(lines)


def where(x: Layout) -> str:
    return f"{x.gpus} GPU{'s' if x.gpus > 1 else ''}, tp {x.tp}, pp {x.pp}"


def why(x: Layout) -> str:
    """`: REASON` when the layout holds nothing for a reason, else nothing."""
    return f": {x.reason}" if x.reason and not x.holds else ""


def headroom(x: Layout, users: int) -> str:
    return f"{x.holds / users - 1:+.0%}"
