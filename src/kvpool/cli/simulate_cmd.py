"""`kvpool simulate MODEL --gpu NAME --trace NAME|PATH`: replay a request trace
against the plans of one or more sizing policies and compare the throughput
they buy."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from kvpool import presets
from kvpool.cli.budget import kv_budget
from kvpool.cli.common import add_json_arg, print_json
from kvpool.cli.kv_events_args import add_kv_events_args, open_publisher, step_publisher
from kvpool.cli.plan_args import (
    add_plan_args,
    limits_from_args,
    parse_pool_ratio,
    spec_for_plan,
)
from kvpool.cli.sim_output import ProgressBar, parse_rate, rebalance_lines, results_table
from kvpool.cli.simulate_args import add_simulation_args
from kvpool.errors import KvpoolError
from kvpool.plan.sizing import check_pool_ratio
from kvpool.presets.traces import load_trace
from kvpool.sim import SimResult, StepTimeModel, load_weights, simulate
from kvpool.sim.policies import (
    PolicyPlan,
    parse_policies,
    parse_range,
    plan_for,
    ratio_policy,
    resolve_group,
    sweep_shares,
)
from kvpool.sim.steptime import Weights
from kvpool.units import format_bytes, parse_size


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a request trace against sizing policies (simulated throughput)",
        description="Replay a trace through the shared scheduler and the real KV cache manager "
        "with a roofline step-time model; compare sizing policies by the throughput "
        "they buy. The budget is --kv-memory, or the whole GPU per rank (GPU memory x utilization - "
        "weights per rank - activations - CUDA graphs - reserve), or (GPU memory - --non-kv-memory) x F.",
    )
    add_plan_args(p, workload=False)  # the trace is --trace; `--policy workload` uses it
    s = add_simulation_args(p)
    add_kv_events_args(s)
    add_json_arg(p)
    p.set_defaults(func=run)


def per_rank(weights: Weights, share: float) -> Weights:
    """`weights` scaled to one rank's `share` of the bytes (total and active alike)."""
    return dataclasses.replace(
        weights, total_params=weights.total_params * share, active_params=weights.active_params * share
    )


def run(args: argparse.Namespace) -> int:
    if args.gpu is None:
        raise KvpoolError("simulate needs --gpu NAME for its step times (kvpool gpus)")
    if args.phase != "final":
        raise KvpoolError("simulate runs final plans; drop --phase profile")
    spec, max_len = spec_for_plan(args)
    limits = limits_from_args(args, max_len)
    gpu = presets.load_gpu(args.gpu)
    weights = load_weights(
        args.model,
        weights_bytes=parse_size(args.weights_bytes) if args.weights_bytes else None,
        active_params=args.active_params,
    )
    given = -(-parse_size(args.weights_bytes) // args.tp) if args.weights_bytes else None
    budget = kv_budget(args, limits, weights_bytes=given, gpu_only_for_budget=False)
    kv_bytes, how = budget.kv_bytes, budget.how
    # one rank's step reads and computes its own share of the weights (the budget's, when it has one)
    if budget.memory is not None:
        weights = per_rank(weights, budget.memory.weights_bytes / (weights.total_params * weights.bytes_per_param))
    elif args.tp > 1:
        weights = per_rank(weights, 1 / args.tp)
    rate = parse_rate(args.rate)
    trace = load_trace(args.trace, max_requests=args.max_requests).with_rate(rate, args.seed)
    model = StepTimeModel.build(spec, gpu, weights)

    given = [
        flag
        for flag, value in (("--compare", args.compare), ("--policy", args.policy), ("--pool-ratio", args.pool_ratio))
        if value
    ]
    if len(given) > 1:  # one would silently win over the other
        raise KvpoolError(
            f"give one of {' / '.join(given)}; to run several, list them all "
            "in --compare (e.g. --compare reference,ratio:full=0.3)"
        )
    if args.compare:
        policies = parse_policies(args.compare)
    elif args.policy:
        policies = parse_policies(args.policy)
    elif args.pool_ratio:
        # as in `kvpool plan`: a share for every group, summing to 1 (the
        # `ratio:` policy of --compare may name only some groups)
        ratio = check_pool_ratio(spec, parse_pool_ratio(args.pool_ratio) or {})
        policies = ["ratio:" + ",".join(f"{k}={v:g}" for k, v in ratio.items())]
    elif args.sweep_ratio:
        policies = ["reference", "typical", "workload"]
    else:
        policies = ["reference"]
    padding = not args.no_padding_reservation
    bar = ProgressBar(not args.quiet)
    publisher = open_publisher(args, spec.groups)
    notes: list[str] = []

    if args.plot:  # a bad plot path should not cost every run
        from kvpool.sim.plot import check_target

        check_target(args.plot)
    group = None
    shares: list[float] = []
    if args.sweep_ratio:  # checked before anything runs: a typo should not cost a whole run
        group = resolve_group(spec, args.sweep_ratio)
        if len(spec.groups) < 2:
            raise KvpoolError(f"{spec.name} has one pool group; there is no split to sweep")
        shares = sweep_shares(args.sweep_points, *parse_range(args.sweep_range))
    elif args.workers or args.ray_address:
        raise KvpoolError("--workers / --ray-address run the points of --sweep-ratio; add it")
    # Plan every named policy first, so that an infeasible one fails in a second, not
    # after the runs before it.
    plans = [
        plan_for(spec, limits, p, kv_memory_bytes=kv_bytes, trace=trace, fit=args.fit, model=model, padding=padding)
        for p in policies
    ]

    def one(policy: str, pp: PolicyPlan | None = None) -> SimResult:
        pp = pp or plan_for(spec, limits, policy, kv_memory_bytes=kv_bytes, trace=trace, fit=args.fit)
        notes.extend(n for n in pp.notes if n not in notes)
        if policy == "rebalance":
            from kvpool.sim.rebalance_sim import simulate_rebalanced

            result, _ = simulate_rebalanced(pp.plan, trace, model, dry_run=args.dry_run, padding=padding)
        else:
            result = simulate(
                pp.plan, trace, model, policy=policy, padding=padding, progress=bar, on_step=step_publisher(publisher)
            )
        bar.done()
        return result

    runs = [one(p, pp) for p, pp in zip(policies, plans, strict=True)]
    sweep: list[tuple[float, SimResult]] = []
    if group is not None and (args.workers or args.ray_address):
        from kvpool.sim.sweep_tasks import run_shares

        sweep, more = run_shares(
            spec,
            limits,
            group,
            shares,
            trace,
            model,
            kv_memory_bytes=kv_bytes,
            fit=args.fit,
            padding=padding,
            workers=args.workers,
            ray_address=args.ray_address,
            progress=not args.quiet,
        )
        notes.extend(more)
        shares = []
    for share in shares:
        assert group is not None
        try:
            sweep.append((share, one(ratio_policy(group, share))))
        except KvpoolError as e:  # a share that cannot hold one request: note it, go on
            notes.append(f"share {share:g} of {group} skipped: {e}")

    everything = runs + [r for _, r in sweep]
    if args.plot:
        from kvpool.sim.plot import plot_runs

        title = f"{spec.name} on {gpu.key}, {trace.name}" + (f" @ {args.rate}/s" if args.rate else "")
        plot_runs(args.plot, runs, title=title, sweep_group=group, sweep=sweep)
    if args.json:
        print_json({"runs": [r.to_json() for r in everything]})
        return 0
    print(
        f"{spec.name} on {gpu.name}: KV {format_bytes(kv_bytes)} ({how}), B={limits.max_batch_size} "
        f"L={limits.max_seq_len} N={limits.max_num_tokens}; trace {trace.name}: {len(trace)} requests, "
        f"rate {args.rate or 'trace times'}; padding dummies {'reserved' if padding else 'lazy'}"
    )
    print(results_table(everything, [g.name for g in spec.groups]))
    for line in rebalance_lines(everything):
        print(line)
    if sweep and group:
        best = max((r for r in everything if r.rebalance is None), key=lambda r: r.output_tokens_per_s)
        print(
            f"\nbest split: {best.policy} ({best.plan.share_of(group):.1%} to {group}), "
            f"{best.output_tokens_per_s:,.0f} tok/s"
        )
        for r in (r for r in runs if r.rebalance is None):
            print(
                f"  {r.policy}: {r.plan.share_of(group):.1%} to {group}, "
                f"{r.output_tokens_per_s:,.0f} tok/s = "
                f"{r.output_tokens_per_s / best.output_tokens_per_s:.1%} of the best"
            )
    rejected = max(r.rejected for r in everything)
    if rejected:
        notes.append(
            f"requests not done were rejected: a prompt of at least max_seq_len "
            f"({limits.max_seq_len}) tokens, or more pages than the pools hold"
        )
    for n in notes:
        print(f"note: {n}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
