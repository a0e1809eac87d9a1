"""`kvpool simulate MODEL --gpu NAME --trace NAME|PATH`: replay a request trace
against the plans of one or more sizing policies and compare the throughput
they buy."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from kvpool import presets
from kvpool.cache import TierSpec
from kvpool.cli.common import add_json_arg, flagged, print_json
from kvpool.cli.files import check_input, check_output, write_output
from kvpool.cli.kv_events_args import add_kv_events_args, open_publisher, step_publisher
from kvpool.cli.plan_args import Resolved, add_plan_args, parse_pool_ratio, resolve
from kvpool.cli.request import PlanRequest
from kvpool.cli.sim_output import ProgressBar, parse_rate, rebalance_lines, results_table, run_json
from kvpool.cli.simulate_args import DEFAULT_SWEEP_RANGE, add_simulation_args, add_tier_sim_args
from kvpool.cli.simulate_tiers import TierRuns, sweep_table, tier_runs
from kvpool.errors import KvpoolError
from kvpool.plan.sizing import check_pool_ratio
from kvpool.presets import GpuSpec
from kvpool.presets.traces import load_trace
from kvpool.sim import SimResult, StepTimeModel, load_weights, simulate
from kvpool.sim.calibration import load_profile
from kvpool.sim.kernels import Calibration
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
from kvpool.spec import ModelSpec
from kvpool.trace import Trace
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
    add_tier_sim_args(p)
    add_json_arg(p)
    p.set_defaults(func=run)


def per_rank(weights: Weights, share: float) -> Weights:
    """`weights` scaled to one rank's `share` of the bytes (total and active alike)."""
    return dataclasses.replace(
        weights, total_params=weights.total_params * share, active_params=weights.active_params * share
    )


@dataclass(frozen=True)
class Setup:
    """What every run of one `kvpool simulate` shares: the resolved plan request,
    the GPU's step-time model, the trace and the policies."""

    resolved: Resolved
    gpu: GpuSpec
    model: StepTimeModel
    trace: Trace
    policies: tuple[str, ...]
    padding: bool
    admission: str | None = None  # --admission; None: each policy's engine's rule
    tiers: TierRuns | None = None  # --host-memory / --disk and how pages move (None: no cold tier)


def run(args: argparse.Namespace) -> int:
    setup = prepare(args)
    spec = setup.resolved.spec
    bar = ProgressBar(not args.quiet)
    publisher = open_publisher(args, spec.groups)
    if args.plot:  # a bad plot path should not cost every run
        from kvpool.sim.plot import check_target

        check_target(args.plot)
    group, shares = sweep_points(args, spec)
    notes: list[str] = [f"step times: calibration {setup.model.calibration} (--calibration; docs/sim.md)"]
    runner = Runner(setup, args.dry_run, bar, step_publisher(publisher), notes)
    # Plan every named policy first, so that an infeasible one fails in a second, not
    # after the runs before it.
    given = next((f for f, v in (("--compare", args.compare), ("--policy", args.policy)) if v), None)
    with flagged(given) if given else contextlib.nullcontext():
        plans = [runner.plan(p, with_model=True) for p in setup.policies]
    if setup.tiers is not None:
        return run_tiered(args, setup, runner, plans)
    runs = [runner.one(p, pp) for p, pp in zip(setup.policies, plans, strict=True)]
    sweep = run_sweep(args, runner, group, shares) if group is not None else []
    everything = runs + [r for _, r in sweep]
    if args.plot:
        from kvpool.sim.plot import plot_format, plot_runs

        title = f"{spec.name} on {setup.gpu.key}, {setup.trace.name}" + (f" @ {args.rate}/s" if args.rate else "")
        fmt = plot_format(args.plot)
        write_output(
            args.plot, lambda f: plot_runs(f, runs, title=title, sweep_group=group, sweep=sweep, fmt=fmt), "--plot"
        )
    if max(r.rejected for r in everything):
        notes.append(
            f"requests not done were rejected: a prompt of at least max_seq_len "
            f"({setup.resolved.limits.max_seq_len}) tokens, or more pages than the pools hold"
        )
    if args.json:
        print_json({"calibration": setup.model.calibration, "runs": [run_json(r) for r in everything]})
        return 0
    print(render(args, setup, runs, everything, sweep, group, notes))
    return 0


def prepare(args: argparse.Namespace) -> Setup:
    """The plan request resolved with simulate's budget rules, the step-time model
    of one rank, the trace at its rate and the policies asked for."""
    if args.gpu is None:
        raise KvpoolError("simulate needs --gpu NAME for its step times (kvpool gpus)")
    if args.phase != "final":
        raise KvpoolError("simulate runs final plans; drop --phase profile")
    request = PlanRequest.from_args(args)
    check_flags(args)
    gpu = presets.load_gpu(args.gpu)
    with flagged("--weights-bytes"):
        total = parse_size(args.weights_bytes) if args.weights_bytes is not None else None
    given = None if total is None else -(-total // request.model.tp)
    if given is not None and given > gpu.memory_bytes:  # one rank holds its share of the weights
        raise KvpoolError(
            f"--weights-bytes {args.weights_bytes} over --tp {request.model.tp} is more than one {gpu.key} holds "
            f"({format_bytes(gpu.memory_bytes)}); give the checkpoint's size, or more --tp"
        )
    resolved = resolve(request, weights_bytes=given, gpu_only_for_budget=False)
    weights = load_weights(args.model, weights_bytes=total, active_params=args.active_params)
    # one rank's step reads and computes its own share of the weights (the budget's, when it has one)
    memory = resolved.budget.memory
    if memory is not None:
        weights = per_rank(weights, memory.weights_bytes / (weights.total_params * weights.bytes_per_param))
    elif request.model.tp > 1:
        weights = per_rank(weights, 1 / request.model.tp)
    with flagged("--trace"):
        trace = load_trace(args.trace, max_requests=args.max_requests).with_rate(parse_rate(args.rate), args.seed)
    with flagged("--calibration"):
        calibration = calibration_from(args.calibration)
    model = StepTimeModel.build(resolved.spec, gpu, weights, calibration)
    policies = tuple(policies_from(args, resolved.spec))
    tiers = tier_runs(args, gpu)
    if tiers is not None:
        if args.sweep_ratio or "rebalance" in policies:
            raise KvpoolError("cold tiers are simulated with static splits: drop --sweep-ratio / rebalance")
        if tiers.sweep and len(policies) > 1:
            raise KvpoolError("a list of --host-memory sizes sweeps one policy: give one, not several")
    return Setup(resolved, gpu, model, trace, policies, not args.no_padding_reservation, args.admission, tiers)


def calibration_from(value: str | None) -> Calibration | str | None:
    """--calibration: None (the GPU's shipped profile), 'roofline', or a profile file."""
    if value is None or value == "roofline":
        return value
    return load_profile(check_input(value, "calibration "))


def check_flags(args: argparse.Namespace) -> None:
    """Values argparse lets through that mean nothing: empty names, empty list
    items, a sweep range without a sweep."""
    for flag, value in (
        ("--compare", args.compare),
        ("--policy", args.policy),
        ("--sweep-ratio", args.sweep_ratio),
        ("--plot", args.plot),
    ):
        if value is not None and not value.strip():
            raise KvpoolError(f"{flag} is empty; give a value or leave the flag out")
    if args.plot is not None:
        with flagged("--plot"):
            check_output(args.plot)
    for flag, value in (("--compare", args.compare), ("--policy", args.policy)):
        if value is not None and any(not item.strip() for item in value.split(",")):
            raise KvpoolError(f"{flag} {value!r} has an empty item; list policies as P1,P2")
    if args.sweep_range != DEFAULT_SWEEP_RANGE and not args.sweep_ratio:
        raise KvpoolError("--sweep-range sets the shares of --sweep-ratio GROUP; add it or drop --sweep-range")


def policies_from(args: argparse.Namespace, spec: ModelSpec) -> list[str]:
    """The policies of --compare, --policy or --pool-ratio (one of them), else the
    sweep's three, else the reference."""
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
        with flagged("--compare"):
            return parse_policies(args.compare)
    if args.policy:
        with flagged("--policy"):
            return parse_policies(args.policy)
    if args.pool_ratio:
        # as in `kvpool plan`: a share for every group, summing to 1 (the
        # `ratio:` policy of --compare may name only some groups)
        with flagged("--pool-ratio"):
            ratio = check_pool_ratio(spec, parse_pool_ratio(args.pool_ratio) or {})
        return ["ratio:" + ",".join(f"{k}={v:g}" for k, v in ratio.items())]
    return ["reference", "typical", "workload"] if args.sweep_ratio else ["reference"]


def sweep_points(args: argparse.Namespace, spec: ModelSpec) -> tuple[str | None, list[float]]:
    """(group, shares) of --sweep-ratio, checked before anything runs: a typo
    should not cost a whole run. (None, []) without it."""
    if not args.sweep_ratio:
        if args.workers or args.ray_address:
            raise KvpoolError("--workers / --ray-address run the points of --sweep-ratio; add it")
        return None, []
    with flagged("--sweep-ratio"):
        group = resolve_group(spec, args.sweep_ratio)
        if len(spec.groups) < 2:
            raise KvpoolError(f"{spec.name} has one pool group; there is no split to sweep")
    with flagged("--sweep-range"):
        return group, sweep_shares(args.sweep_points, *parse_range(args.sweep_range))


@dataclass
class Runner:
    """Plans and simulates one policy at a time on a `Setup`, collecting notes."""

    setup: Setup
    dry_run: bool
    bar: ProgressBar
    on_step: Any
    notes: list[str]

    def plan(self, policy: str, *, with_model: bool = False) -> PolicyPlan:
        """`policy`'s plan; `with_model`: the step times and padding that `tuned`
        simulates with (the sweep's ratio points need neither)."""
        s, r = self.setup, self.setup.resolved
        return plan_for(
            r.spec,
            r.limits,
            policy,
            kv_memory_bytes=r.budget.kv_bytes,
            trace=s.trace,
            fit=r.request.fit,
            model=s.model if with_model else None,
            padding=s.padding or not with_model,
        )

    def one(self, policy: str, pp: PolicyPlan | None = None, tiers: list[TierSpec] | None = None) -> SimResult:
        """`policy` simulated (on `pp`, its plan, when given), with `tiers` below
        the GPU pools when given (`Setup.tiers` says how pages move)."""
        s = self.setup
        pp = pp or self.plan(policy)
        self.notes.extend(n for n in pp.notes if n not in self.notes)
        if policy == "rebalance":
            from kvpool.sim.rebalance_sim import simulate_rebalanced

            result, _ = simulate_rebalanced(pp.plan, s.trace, s.model, dry_run=self.dry_run, padding=s.padding)
        else:
            result = simulate(
                pp.plan,
                s.trace,
                s.model,
                policy=policy,
                padding=s.padding,
                progress=self.bar,
                on_step=self.on_step,
                admission=s.admission,
                tiers=tiers or (),
                link=s.tiers.link if tiers and s.tiers else None,
                preemption=s.tiers.preemption if tiers and s.tiers else "recompute",
            )
        self.bar.done()
        return result


def run_sweep(
    args: argparse.Namespace, runner: Runner, group: str, shares: list[float]
) -> list[tuple[float, SimResult]]:
    """One run per share of `group`: as Ray tasks with --workers / --ray-address,
    else here, one after the other (a share that cannot hold one request is noted)."""
    s, r = runner.setup, runner.setup.resolved
    if args.workers or args.ray_address:
        from kvpool.sim.sweep_tasks import run_shares

        sweep, more = run_shares(
            r.spec,
            r.limits,
            group,
            shares,
            s.trace,
            s.model,
            kv_memory_bytes=r.budget.kv_bytes,
            fit=r.request.fit,
            padding=s.padding,
            workers=args.workers,
            ray_address=args.ray_address,
            progress=not args.quiet,
        )
        runner.notes.extend(more)
        return sweep
    sweep = []
    for share in shares:
        try:
            sweep.append((share, runner.one(ratio_policy(group, share))))
        except KvpoolError as e:  # a share that cannot hold one request: note it, go on
            runner.notes.append(f"share {share:g} of {group} skipped: {e}")
    return sweep


def render(
    args: argparse.Namespace,
    setup: Setup,
    runs: list[SimResult],
    everything: list[SimResult],
    sweep: list[tuple[float, SimResult]],
    group: str | None,
    notes: list[str],
) -> str:
    """The text report: the setup line, the results table, rebalance lines, the
    best split of a sweep, notes and the plot's path."""
    r = setup.resolved
    lines = [
        header(args, setup),
        results_table(everything, [g.name for g in r.spec.groups]),
        *rebalance_lines(everything),
    ]
    if sweep and group:
        best = max((x for x in everything if x.rebalance is None), key=lambda x: x.output_tokens_per_s)
        lines.append(
            f"\nbest split: {best.policy} ({best.plan.share_of(group):.1%} to {group}), "
            f"{best.output_tokens_per_s:,.0f} tok/s"
        )
        lines += [
            f"  {x.policy}: {x.plan.share_of(group):.1%} to {group}, {x.output_tokens_per_s:,.0f} tok/s = "
            f"{x.output_tokens_per_s / best.output_tokens_per_s:.1%} of the best"
            for x in runs
            if x.rebalance is None
        ]
    lines += [f"note: {n}" for n in notes]
    if args.plot:
        lines.append(f"plot: {args.plot}")
    return "\n".join(lines)


def header(args: argparse.Namespace, setup: Setup) -> str:
    """The setup line of the text report."""
    r, budget = setup.resolved, setup.resolved.budget
    lim = r.limits
    return (
        f"{r.spec.name} on {setup.gpu.name}: KV {format_bytes(budget.kv_bytes)} ({budget.how}), "
        f"B={lim.max_batch_size} L={lim.max_seq_len} N={lim.max_num_tokens}; trace {setup.trace.name}: "
        f"{len(setup.trace)} requests, rate {args.rate or 'trace times'}; padding dummies "
        f"{'reserved' if setup.padding else 'lazy'}"
    )


def run_tiered(args: argparse.Namespace, setup: Setup, runner: Runner, plans: list[PolicyPlan]) -> int:
    """Each policy with cold tiers, once per --host-memory size: the results
    table, then per size what the host tier bought (and a plot of it)."""
    tiers = setup.tiers
    assert tiers is not None
    specs = {(i, size): tiers.specs(args, pp.plan, size) for i, pp in enumerate(plans) for size in tiers.sizes}
    rows: list[tuple[str | None, SimResult]] = []  # every size checked above: a bad one fails before the runs
    for i, (policy, pp) in enumerate(zip(setup.policies, plans, strict=True)):
        for size in tiers.sizes:
            result = runner.one(policy, pp, specs[i, size])
            if tiers.sweep:
                result = dataclasses.replace(result, policy=f"{policy} host {size}")
            rows.append((size, result))
    runs = [r for _, r in rows]
    if args.plot:
        from kvpool.sim.plot import plot_format, plot_host_sweep, plot_runs

        title = f"{setup.resolved.spec.name} on {setup.gpu.key}, {setup.trace.name}"
        fmt = plot_format(args.plot)
        points = [((r.tiers or {})["bytes"].get("CPU", 0), r) for r in runs]
        draw: Callable[[BinaryIO], None] = (
            (lambda f: plot_host_sweep(f, points, title=title, fmt=fmt))
            if tiers.sweep
            else (lambda f: plot_runs(f, runs, title=title, fmt=fmt))
        )
        write_output(args.plot, draw, "--plot")
    notes = runner.notes
    if max(r.rejected for r in runs):
        notes.append(f"requests not done were rejected (max_seq_len {setup.resolved.limits.max_seq_len}, or pages)")
    if args.json:
        out = [{**run_json(r), "host_memory": size} for size, r in rows]
        print_json({"calibration": setup.model.calibration, "runs": out})
        return 0
    link = tiers.link
    lines = [
        header(args, setup),
        results_table(runs, [g.name for g in setup.resolved.spec.groups]),
        "",
        f"cold tiers ({args.host_rule} rule): host link {link.host_bytes_per_s / 1e9:.1f} GB/s per direction, "
        f"disk {link.disk_bytes_per_s / 1e9:.2f} GB/s, copies {'overlap the step' if link.overlap else 'before the step'}"
        f", preemption by {tiers.preemption}",
        sweep_table(rows),
        *(f"note: {n}" for n in notes),
    ]
    if args.plot:
        lines.append(f"plot: {args.plot}")
    print("\n".join(lines))
    return 0
