"""`kvpool simulate MODEL --gpu NAME --trace NAME|PATH`: replay a request trace
against the plans of one or more sizing policies and compare the throughput
they buy. The runs are `kvpool.deploy.simulate`'s; this module reads the options,
publishes KV events, draws the plot and prints."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from kvpool.cli.common import add_json_arg, print_json, say_fallback
from kvpool.cli.files import check_input, check_output, write_output
from kvpool.cli.fleet_output import RequestBar, add_fleet_args, render_run
from kvpool.cli.kv_events_args import add_kv_events_args, open_publisher, step_publisher
from kvpool.cli.plan_args import add_plan_args, plan_keywords
from kvpool.cli.sim_output import (
    ProgressBar,
    online_lines,
    parse_rate,
    rebalance_lines,
    results_table,
    sweep_table,
)
from kvpool.cli.simulate_args import add_simulation_args, add_tier_sim_args
from kvpool.deploy.simulation import Simulation, SimulationResult
from kvpool.errors import KvpoolError, flagged
from kvpool.media import Medium
from kvpool.units import format_bytes

if TYPE_CHECKING:  # one replica's run loads no fleet
    from kvpool.deploy.fleets import FleetLayout


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a request trace against sizing policies (simulated throughput)",
        description="Replay a trace through the shared scheduler and the real KV cache manager, "
        "timing each step with a model calibrated on measured GPU kernels (the GPU's shipped profile; "
        "--calibration roofline for the uncalibrated peak rates), and compare sizing policies by the "
        "throughput they buy. The budget is --kv-memory, or the whole GPU per rank (GPU memory x "
        "utilization - weights per rank - activations - CUDA graphs - reserve), or (GPU memory - "
        "--non-kv-memory) x F.",
    )
    add_plan_args(p, workload=False)  # the trace is --trace; `--policy workload` uses it
    s = add_simulation_args(p)
    add_kv_events_args(s)
    add_tier_sim_args(p)
    add_fleet_args(p)
    add_json_arg(p)
    p.set_defaults(func=run)


SIMULATE_KEYWORDS = (
    "policy",
    "compare",
    "sweep_ratio",
    "sweep_points",
    "sweep_range",
    "workers",
    "ray_address",
    "max_requests",
    "seed",
    "weights_bytes",
    "active_params",
    "admission",
    "dry_run",
    "host_memory",
    "disk",
    "host_rule",
    "ranks_per_node",
    "preemption",
    "host_bandwidth",
    "disk_bandwidth",
    "transfer_overlap",
)


def simulate_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """`deploy.simulate`'s keywords from the options."""
    if args.gpu is None:
        raise KvpoolError("simulate needs --gpu NAME for its step times (kvpool gpus)")
    calibration = args.calibration
    if calibration not in (None, "roofline"):
        with flagged("--calibration"):
            calibration = check_input(calibration, "calibration ")
    return {
        **plan_keywords(args),
        **{k: getattr(args, k) for k in SIMULATE_KEYWORDS},
        "gpu": args.gpu,
        "trace": args.trace,
        "rate": parse_rate(args.rate),
        "padding_reservation": not args.no_padding_reservation,
        "calibration": calibration,
        "hash_lookahead": args.hash_lookahead,
        "reuse": not args.no_reuse,
    }


FLEET_OPTIONS = ("replicas", "router", "prefill_replicas", "decode_replicas", "link", "slo")


def fleet_layout(args: argparse.Namespace) -> FleetLayout | None:
    """The fleet the options ask for, or None (one replica, no fleet option)."""
    if all(getattr(args, k) is None for k in FLEET_OPTIONS) and not args.event_lag_ms:
        return None
    from kvpool.deploy.fleets import FleetLayout

    return FleetLayout(
        args.replicas or 1,
        args.router or "round-robin",
        args.event_lag_ms,
        args.prefill_replicas or 0,
        args.decode_replicas or 0,
        link=args.link,
    )


def run(args: argparse.Namespace) -> int:
    if args.plot is not None and not args.plot.strip():
        raise KvpoolError("--plot is empty; give a value or leave the flag out")
    if args.plot is not None:
        with flagged("--plot"):
            check_output(args.plot)
    layout = fleet_layout(args)
    if layout is not None:
        return run_fleet(args, layout)
    setup = Simulation.of(args.model, **simulate_keywords(args))
    say_fallback(setup.spec)
    publisher = open_publisher(args, setup.spec.groups)
    if args.plot:  # a bad plot path should not cost every run
        from kvpool.sim.plot import check_target

        check_target(args.plot)
    bar = ProgressBar(not args.quiet)
    try:
        result = setup.run(progress=bar, on_step=step_publisher(publisher))
    finally:
        bar.done()
    if args.plot:
        plot(args, result)
    if args.json:
        print_json(result.to_dict())
    else:
        print(render(args, result))
    return 0


def plot(args: argparse.Namespace, result: SimulationResult) -> None:
    """--plot: the runs (and the sweep's curve), or with a list of host sizes the
    prompt hits and TTFT against the host tier; written whole or not at all."""
    from kvpool.sim.plot import plot_format, plot_host_sweep, plot_runs

    s, fmt = result.simulation, plot_format(args.plot)
    title = f"{s.spec.name} on {s.gpu.key}, {s.trace.name}"
    if s.tiers is not None and s.tiers.sweep:
        points = [((r.tiers or {})["bytes"].get(Medium.CPU, 0), r) for r in result.runs]
        write_output(args.plot, lambda f: plot_host_sweep(f, points, title=title, fmt=fmt), "--plot")
        return
    if s.tiers is None and args.rate:
        title += f" @ {args.rate}/s"
    group = s.sweep.group if s.sweep is not None else None
    runs, sweep = list(result.runs), list(result.sweep)
    write_output(
        args.plot, lambda f: plot_runs(f, runs, title=title, sweep_group=group, sweep=sweep, fmt=fmt), "--plot"
    )


def render(args: argparse.Namespace, result: SimulationResult) -> str:
    """The text report: the setup line, the results table, then the cold tiers'
    table, or rebalance lines and the best split of a sweep; notes and the plot's path."""
    s = result.simulation
    lines = [header(args, result), results_table(list(result.everything), [g.name for g in s.spec.groups])]
    if s.tiers is not None:
        link = s.tiers.link
        lines += [
            "",
            f"cold tiers ({args.host_rule} rule): host link {link.host_bytes_per_s / 1e9:.1f} GB/s per direction, "
            f"disk {link.disk_bytes_per_s / 1e9:.2f} GB/s, copies "
            f"{'overlap the step' if link.overlap else 'before the step'}, preemption by {s.tiers.preemption}",
            sweep_table(list(zip(result.host_sizes, result.runs, strict=True))),
        ]
    else:
        runs = list(result.everything)
        lines += [*rebalance_lines(runs), *online_lines(runs), *best_split(result)]
    lines += [f"note: {n}" for n in result.notes]
    if args.plot:
        lines.append(f"plot: {args.plot}")
    return "\n".join(lines)


def best_split(result: SimulationResult) -> list[str]:
    """The best share of a sweep, and where each policy lands against it."""
    sweep = result.simulation.sweep
    if not result.sweep or sweep is None:
        return []
    group = sweep.group
    best = max((x for x in result.everything if not x.moved_split), key=lambda x: x.output_tokens_per_s)
    lines = [
        f"\nbest split: {best.policy} ({best.plan.share_of(group):.1%} to {group}), "
        f"{best.output_tokens_per_s:,.0f} tok/s"
    ]
    return lines + [
        f"  {x.policy}: {x.plan.share_of(group):.1%} to {group}, {x.output_tokens_per_s:,.0f} tok/s = "
        f"{x.output_tokens_per_s / best.output_tokens_per_s:.1%} of the best"
        for x in result.runs
        if not x.moved_split
    ]


def header(args: argparse.Namespace, result: SimulationResult) -> str:
    """The setup line of the text report."""
    s = result.simulation
    r, budget = s.resolved, s.resolved.budget
    lim = r.limits
    return (
        f"{r.spec.name} on {s.gpu.name}: KV {format_bytes(budget.kv_bytes)} ({budget.how}), "
        f"B={lim.max_batch_size} L={lim.max_seq_len} N={lim.max_num_tokens}; trace {s.trace.name}: "
        f"{len(s.trace)} requests, rate {args.rate or 'trace times'}; padding dummies "
        f"{'reserved' if s.padding else 'lazy'}"
    )


def run_fleet(args: argparse.Namespace, layout: FleetLayout) -> int:
    """`simulate` with fleet options: the fleet's run (`deploy.fleets`), its table or --json, its plot."""
    if args.kv_events is not None:
        raise KvpoolError("--kv-events publishes one replica's events; a fleet's go to its router: drop it")
    from kvpool.deploy.fleets import FleetSimulation

    setup = FleetSimulation.of(args.model, layout=layout, slo=args.slo, **simulate_keywords(args))
    say_fallback(setup.simulation.spec)
    if args.plot:
        from kvpool.sim.plot import check_target

        check_target(args.plot)
    bar = RequestBar(not args.quiet)
    try:
        result = setup.run(progress=bar)
    finally:
        bar.close()
    if args.plot:
        from kvpool.fleet.plot import plot_fleet
        from kvpool.sim.plot import plot_format

        s, fmt = setup.simulation, plot_format(args.plot)
        title = f"{s.spec.name} on {s.gpu.key}, {s.trace.name}"
        write_output(
            args.plot, lambda f: plot_fleet(f, result.result, result.aggregated, title=title, fmt=fmt), "--plot"
        )
    if args.json:
        print_json(result.to_dict())
        return 0
    s = setup.simulation
    lim = s.resolved.limits
    print(
        render_run(
            result,
            f"{s.spec.name} on {s.gpu.name}, per replica KV {format_bytes(s.resolved.budget.kv_bytes)} "
            f"B={lim.max_batch_size} L={lim.max_seq_len} N={lim.max_num_tokens}; trace {s.trace.name}: "
            f"{len(s.trace)} requests, rate {args.rate or 'trace times'}",
        )
    )
    return 0
