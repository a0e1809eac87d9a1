"""`simulate`: replay a request trace against the plans of one or more sizing
policies and compare the throughput they buy (`kvpool simulate`).

A `Simulation` is the set-up every run of one comparison shares, built once by
`Simulation.of` from the same keywords `simulate` takes: the plan request resolved
with simulate's budget rules, one rank's step-time model, the trace at its rate,
the policies, a sweep of one group's share and the cold tiers. `Simulation.run`
plans each policy first (an infeasible one fails in a second, not after the runs
before it), then runs them; `SimulationResult.to_dict()` is what
`kvpool simulate --json` prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from kvpool import presets
from kvpool.cache import TierSpec
from kvpool.deploy.options import KEYWORDS, PlanKeywords, PlanRequest
from kvpool.deploy.rank_steps import calibration_of, rank_weights, step_weights, weights_total
from kvpool.deploy.resolution import Resolved, resolve
from kvpool.deploy.sim_tiers import TierRuns, tier_runs
from kvpool.errors import KvpoolError, flagged
from kvpool.plan.sizing import check_pool_ratio
from kvpool.presets import GpuSpec
from kvpool.presets.traces import load_trace
from kvpool.sim import Progress, SimResult, StepTimeModel, Weights
from kvpool.sim import simulate as simulate_plan
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
from kvpool.spec import ModelSpec
from kvpool.trace import Trace

if TYPE_CHECKING:
    from kvpool.cache import KVCacheManager

DEFAULT_SWEEP_RANGE = "0.05:0.95"
OnStep = Callable[["KVCacheManager"], None]


class SimulateKeywords(PlanKeywords, total=False):
    """`simulate`'s keywords beyond the plan's (`PlanKeywords`); see `simulate`."""

    policy: str | None
    compare: str | Sequence[str] | None
    sweep_ratio: str | None
    sweep_points: int
    sweep_range: str
    workers: int | None
    ray_address: str | None
    rate: float | None
    max_requests: int | None
    seed: int
    padding_reservation: bool
    weights: Weights | None
    weights_bytes: int | str | None
    active_params: float | None
    admission: str | None
    calibration: Calibration | str | Path | None
    dry_run: bool
    host_memory: int | str | Sequence[int | str] | None
    disk: int | str | None
    host_rule: str
    ranks_per_node: int | None
    preemption: str
    host_bandwidth: float | None
    disk_bandwidth: float | None
    transfer_overlap: bool
    hash_lookahead: int
    reuse: bool


@dataclass(frozen=True)
class Sweep:
    """`group`'s byte share at each of `shares`, one run per share (as Ray tasks
    with `workers` / `ray_address`, else here one after the other)."""

    group: str
    shares: tuple[float, ...]
    workers: int | None = None
    ray_address: str | None = None


@dataclass(frozen=True)
class SimulationResult:
    """The runs of one `Simulation`: `runs` one per policy (with cold tiers, one
    per policy and host size, `host_sizes` beside them), `sweep` the (share, run)
    points of a sweep, `notes` what the reader should know."""

    simulation: Simulation
    runs: tuple[SimResult, ...]
    sweep: tuple[tuple[float, SimResult], ...] = ()
    host_sizes: tuple[str | None, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def everything(self) -> tuple[SimResult, ...]:
        """The policies' runs, then the sweep's."""
        return self.runs + tuple(r for _, r in self.sweep)

    def to_dict(self) -> dict[str, Any]:
        runs = [run_json(r) for r in self.everything]
        if self.host_sizes:
            runs = [{**r, "host_memory": size} for r, size in zip(runs, self.host_sizes, strict=True)]
        return {"calibration": self.simulation.model.calibration, "runs": runs}


def run_json(r: SimResult) -> dict[str, Any]:
    """One run as `--json` prints it: the result's own fields plus every other
    number the table shows (TPOT p99, padding failures, mean pages used, reuse
    hits, requests done and rejected), so that a script reads what a person does."""
    out = r.to_json()
    out.update(
        tpot_p99_s=r.percentile(r.tpot_s, 99),
        padding_failures=r.padding_failures,
        reuse_hit_rate=r.reuse_hit_rate,
        prompt_hit_rate=r.prompt_hit_rate,  # the share a router or Dynamo's mocker reports
        finished=r.finished,
        num_requests=r.num_requests,
        rejected=r.rejected,
        shared_pool=bool(r.plan.shared),
    )
    for name, u in r.pages.items():
        out["pages"][name].update(mean_used=u.mean_used)
    return out


def policy_list(values: dict[str, Any], spec: ModelSpec, pool_ratio: Any) -> tuple[tuple[str, ...], str | None]:
    """(the policies, the option that named them): those of compare, policy or
    pool_ratio (one of them), else the sweep's three, else the reference."""
    compare = values.get("compare")
    if compare is not None and not isinstance(compare, str):
        compare = ",".join(compare)
    named = {"--compare": compare, "--policy": values.get("policy")}
    given = [f for f, v in (*named.items(), ("--pool-ratio", pool_ratio)) if v]
    if len(given) > 1:  # one would silently win over the other
        raise KvpoolError(
            f"give one of {' / '.join(given)}; to run several, list them all "
            "in --compare (e.g. --compare reference,ratio:full=0.3)"
        )
    for flag, text in named.items():
        if text is not None:
            return named_policies(flag, text), flag
    if pool_ratio:
        return (ratio_of(spec, pool_ratio),), None
    return ("reference", "typical", "workload") if values.get("sweep_ratio") else ("reference",), None


def ratio_of(spec: ModelSpec, pool_ratio: Mapping[str, float]) -> str:
    """The `ratio:` policy of pool_ratio: as in `plan`, a share for every group,
    summing to 1 (the `ratio:` policy of compare may name only some groups)."""
    with flagged("--pool-ratio"):
        ratio = check_pool_ratio(spec, pool_ratio)
    return "ratio:" + ",".join(f"{k}={v:g}" for k, v in ratio.items())


def named_policies(flag: str, text: str) -> tuple[str, ...]:
    """The policies of `text` (P1,P2,...; a `ratio:` entry keeps its commas)."""
    if not text.strip():
        raise KvpoolError(f"{flag} is empty; give a value or leave the flag out")
    if any(not item.strip() for item in text.split(",")):
        raise KvpoolError(f"{flag} {text!r} has an empty item; list policies as P1,P2")
    with flagged(flag):
        return tuple(parse_policies(text))


def sweep_of(values: dict[str, Any], spec: ModelSpec) -> Sweep | None:
    """The sweep of sweep_ratio, checked before anything runs: a typo should not
    cost a whole run. None without one."""
    group, text = values.get("sweep_ratio"), values.get("sweep_range", DEFAULT_SWEEP_RANGE)
    workers, address = values.get("workers"), values.get("ray_address")
    if group is None:
        if text != DEFAULT_SWEEP_RANGE:
            raise KvpoolError("--sweep-range sets the shares of --sweep-ratio GROUP; add it or drop --sweep-range")
        if workers or address:
            raise KvpoolError("--workers / --ray-address run the points of --sweep-ratio; add it")
        return None
    if not group.strip():
        raise KvpoolError("--sweep-ratio is empty; give a value or leave the flag out")
    with flagged("--sweep-ratio"):
        name = resolve_group(spec, group)
        if len(spec.groups) < 2:
            raise KvpoolError(f"{spec.name} has one pool group; there is no split to sweep")
    with flagged("--sweep-range"):
        shares = sweep_shares(values.get("sweep_points", 10), *parse_range(text))
    return Sweep(name, tuple(shares), workers, address)


@dataclass(frozen=True)
class Simulation:
    """What every run of one comparison shares (module docstring)."""

    resolved: Resolved
    gpu: GpuSpec
    model: StepTimeModel
    trace: Trace
    policies: tuple[str, ...]
    padding: bool = True
    admission: str | None = None  # None: each policy's engine's rule
    tiers: TierRuns | None = None  # host_memory / disk and how pages move (None: no cold tier)
    sweep: Sweep | None = None
    dry_run: bool = False
    named_by: str | None = None  # the option that named the policies (--compare, --policy), if one did
    hash_lookahead: int = 0  # each page's digest covers the L ids after it (vLLM 0.33 with an EAGLE drafter)
    reuse: bool = True  # prefix reuse, on in every engine simulated (off: a preempted request recomputes all)

    @classmethod
    def of(cls, model: str, *, gpu: str, trace: str | Trace, **options: Unpack[SimulateKeywords]) -> Simulation:
        """The set-up `simulate` runs (its keywords). Raises KvpoolError naming the
        option for anything that would make a run meaningless, before any runs."""
        values: dict[str, Any] = dict(options)
        request = one_replica(model, gpu, {k: values.pop(k) for k in list(values) if k in KEYWORDS})
        unknown = sorted(set(values) - set(SimulateKeywords.__optional_keys__))
        if unknown:
            raise KvpoolError(f"unknown option(s) {', '.join(unknown)}")
        weights: Weights | None = values.get("weights")
        total = weights_total(weights, values.get("weights_bytes"), values.get("active_params"))
        gpu_spec = presets.load_gpu(str(request.budget.gpu))
        given = rank_weights(total, values.get("weights_bytes"), request.model.tp, gpu_spec)
        resolved = resolve(request, weights_bytes=given, gpu_only_for_budget=False)
        one_rank = step_weights(model, resolved, weights, total, values.get("active_params"))
        loaded = trace_of(trace, values)
        steps = StepTimeModel.build(resolved.spec, gpu_spec, one_rank, calibration_of(values.get("calibration")))
        policies, named_by = policy_list(values, resolved.spec, request.pool_ratio)
        sweep = sweep_of(values, resolved.spec)
        tiers = tier_runs(values, gpu_spec)
        check_tiers(tiers, sweep, policies)
        lookahead = check_lookahead(values.get("hash_lookahead", 0), policies, sweep, loaded)
        reuse = values.get("reuse", True)
        if type(reuse) is not bool:
            raise KvpoolError(f"reuse (--no-reuse) must be True or False, got {reuse!r}")
        ray = sweep is not None and (sweep.workers or sweep.ray_address)
        if not reuse and (lookahead or ray or "online" in policies):
            raise KvpoolError(
                "reuse=False (--no-reuse) runs here only: drop --hash-lookahead (it needs reuse) / online / "
                "the sweep's --workers (they build their own runs)"
            )
        return cls(
            resolved,
            gpu_spec,
            steps,
            loaded,
            policies,
            values.get("padding_reservation", True),
            values.get("admission"),
            tiers,
            sweep,
            values.get("dry_run", False),
            named_by,
            lookahead,
            reuse,
        )

    @property
    def spec(self) -> ModelSpec:
        return self.resolved.spec

    def plan(self, policy: str, *, with_model: bool = False) -> PolicyPlan:
        """`policy`'s plan; `with_model`: the step times and padding that `tuned`
        simulates with (the sweep's ratio points need neither)."""
        r = self.resolved
        return plan_for(
            r.spec,
            r.limits,
            policy,
            kv_memory_bytes=r.budget.kv_bytes,
            trace=self.trace,
            fit=r.request.shrink_to_fit,
            model=self.model if with_model else None,
            padding=self.padding or not with_model,
        )

    def run_one(
        self,
        pp: PolicyPlan,
        tiers: Sequence[TierSpec] = (),
        progress: Callable[[Progress], None] | None = None,
        on_step: OnStep | None = None,
    ) -> SimResult:
        """`pp.name` simulated on its plan, with `tiers` below the GPU pools when
        given (`Simulation.tiers` says how pages move)."""
        if pp.name == "rebalance":
            from kvpool.sim.rebalance_sim import simulate_rebalanced

            result, _ = simulate_rebalanced(
                pp.plan, self.trace, self.model, dry_run=self.dry_run, padding=self.padding, reuse=self.reuse
            )
            return result
        if pp.name == "online":
            from kvpool.sim.online import simulate_online

            r = self.resolved
            result, _ = simulate_online(
                r.spec,
                r.limits,
                self.trace,
                self.model,
                kv_memory_bytes=r.budget.kv_bytes,
                fit=r.request.shrink_to_fit,
                padding=self.padding,
                admission=self.admission,
            )
            return result
        moves = self.tiers if tiers and self.tiers else None
        return simulate_plan(
            pp.plan,
            self.trace,
            self.model,
            policy=pp.name,
            padding=self.padding,
            progress=progress,
            on_step=on_step,
            admission=self.admission,
            tiers=list(tiers),
            link=moves.link if moves else None,
            preemption=moves.preemption if moves else "recompute",
            hash_lookahead=self.hash_lookahead,
            reuse=self.reuse,
        )

    def run(
        self, *, progress: Callable[[Progress], None] | None = None, on_step: OnStep | None = None
    ) -> SimulationResult:
        """Plan every policy, then run each (and the sweep, or each host size)."""
        with flagged(self.named_by) if self.named_by else contextlib.nullcontext():
            plans = [self.plan(p, with_model=True) for p in self.policies]
        notes = [f"step times: calibration {self.model.calibration} (--calibration; docs/sim.md)"]
        if self.tiers is not None:
            return self.run_tiered(plans, notes, progress, on_step)
        runs = [self.run_noted(pp, notes, progress=progress, on_step=on_step) for pp in plans]
        sweep = self.run_sweep(notes, progress, on_step) if self.sweep is not None else []
        if max(r.rejected for r in runs + [r for _, r in sweep]):
            notes.append(
                f"requests not done were rejected: a prompt of at least max_seq_len "
                f"({self.resolved.limits.max_seq_len}) tokens, or more pages than the pools hold"
            )
        return SimulationResult(self, tuple(runs), tuple(sweep), (), tuple(notes))

    def run_noted(
        self,
        pp: PolicyPlan,
        notes: list[str],
        tiers: Sequence[TierSpec] = (),
        progress: Callable[[Progress], None] | None = None,
        on_step: OnStep | None = None,
    ) -> SimResult:
        """`run_one`, the plan's notes added to `notes` (each once) first."""
        notes.extend(n for n in pp.notes if n not in notes)
        return self.run_one(pp, tiers, progress, on_step)

    def run_sweep(
        self, notes: list[str], progress: Callable[[Progress], None] | None, on_step: OnStep | None
    ) -> list[tuple[float, SimResult]]:
        """One run per share of the sweep's group (a share that cannot hold one request is noted)."""
        sweep, r = self.sweep, self.resolved
        assert sweep is not None
        if sweep.workers or sweep.ray_address:
            from kvpool.sim.sweep_tasks import run_shares

            points, more = run_shares(
                r.spec,
                r.limits,
                sweep.group,
                list(sweep.shares),
                self.trace,
                self.model,
                kv_memory_bytes=r.budget.kv_bytes,
                fit=r.request.shrink_to_fit,
                padding=self.padding,
                workers=sweep.workers,
                ray_address=sweep.ray_address,
                progress=progress is not None,
            )
            notes.extend(more)
            return points
        points = []
        for share in sweep.shares:
            try:
                pp = self.plan(ratio_policy(sweep.group, share))
                points.append((share, self.run_noted(pp, notes, progress=progress, on_step=on_step)))
            except KvpoolError as e:  # a share that cannot hold one request: note it, go on
                notes.append(f"share {share:g} of {sweep.group} skipped: {e}")
        return points

    def run_tiered(
        self,
        plans: list[PolicyPlan],
        notes: list[str],
        progress: Callable[[Progress], None] | None,
        on_step: OnStep | None,
    ) -> SimulationResult:
        """Each policy with cold tiers, once per host size."""
        tiers = self.tiers
        assert tiers is not None
        m = self.resolved.request.model
        # every size's tiers first: a bad one fails before the runs, not after some
        specs = {
            (i, size): tiers.specs(pp.plan, size, m.tp, m.pp) for i, pp in enumerate(plans) for size in tiers.sizes
        }
        runs, sizes = [], []
        for i, pp in enumerate(plans):
            for size in tiers.sizes:
                result = self.run_noted(pp, notes, specs[i, size], progress, on_step)
                if tiers.sweep:
                    result = dataclasses.replace(result, policy=f"{pp.name} host {size}")
                runs.append(result)
                sizes.append(size)
        if max(r.rejected for r in runs):
            notes.append(f"requests not done were rejected (max_seq_len {self.resolved.limits.max_seq_len}, or pages)")
        return SimulationResult(self, tuple(runs), (), tuple(sizes), tuple(notes))


def one_replica(model: str, gpu: str, plan_options: dict[str, Any]) -> PlanRequest:
    """The plan request of a simulation: one replica (its step times are one rank's), final plans."""
    if plan_options.get("phase", "final") != "final":
        raise KvpoolError("simulate runs final plans; drop --phase profile")
    request = PlanRequest.of(model, gpu, **plan_options)
    if request.replicas > 1:
        ranks = request.model.tp * request.model.pp
        raise KvpoolError(
            f"simulate runs one replica of tp {request.model.tp} x pp {request.model.pp}; --gpu {gpu} holds "
            f"{request.replicas}: give --gpu {request.budget.gpu}x{ranks}"
        )
    return request


def trace_of(trace: str | Trace, values: dict[str, Any]) -> Trace:
    """The trace (a name, a file or a `Trace`), its first `max_requests`, at `rate` (seeded)."""
    first = values.get("max_requests")
    with flagged("--trace"):
        loaded = trace.head(first) if isinstance(trace, Trace) else load_trace(trace, max_requests=first)
        return loaded.with_rate(values.get("rate"), values.get("seed", 0))


def check_tiers(tiers: TierRuns | None, sweep: Sweep | None, policies: tuple[str, ...]) -> None:
    """Cold tiers run static splits, and a list of host sizes one policy."""
    if tiers is None:
        return
    if sweep is not None or {"rebalance", "online"} & set(policies):
        raise KvpoolError("cold tiers are simulated with static splits: drop --sweep-ratio / rebalance / online")
    if tiers.sweep and len(policies) > 1:
        raise KvpoolError("a list of --host-memory sizes sweeps one policy: give one, not several")


def check_lookahead(ahead: object, policies: tuple[str, ...], sweep: Sweep | None, trace: Trace) -> int:
    """`hash_lookahead`: an int >= 0; above 0 it needs prefix reuse (a trace
    with hash ids) and runs on the static splits here (not in rebalance runs
    or online runs, or a sweep's Ray tasks, which build their own managers)."""
    if type(ahead) is not int or ahead < 0:
        raise KvpoolError(f"hash_lookahead (--hash-lookahead) must be an int >= 0 (0: off), got {ahead!r}")
    if not ahead:
        return 0
    if trace.hash_ids is None:
        raise KvpoolError(
            f"hash_lookahead (--hash-lookahead) hashes pages for prefix reuse, "
            f"which trace {trace.name!r} has no ids for: give a trace with hash ids"
        )
    if {"rebalance", "online"} & set(policies) or (sweep is not None and (sweep.workers or sweep.ray_address)):
        raise KvpoolError(
            "hash_lookahead (--hash-lookahead) runs on static splits here: drop rebalance / online / the sweep's --workers"
        )
    return ahead


def simulate(
    model: str,
    *,
    gpu: str,
    trace: str | Trace,
    progress: Callable[[Progress], None] | None = None,
    on_step: OnStep | None = None,
    **options: Unpack[SimulateKeywords],
) -> SimulationResult:
    """Replay `trace` (a bundled trace's name, a CSV / JSONL file, or a `Trace`)
    through the shared scheduler and the real KV cache manager, with step times of
    one rank of `gpu` (NAME or NAMExN: N GPUs as tensor parallelism, one replica),
    for each sizing policy asked for, and compare the throughput they buy.

    Policies: `policy` (one) or `compare` (several: reference, typical, workload,
    occupancy, tuned, rebalance, online, engine:vllm|sglang|trtllm, ratio:GROUP=SHARE),
    or `pool_ratio`; `sweep_ratio=GROUP` scans that group's share over
    `sweep_range` at `sweep_points` shares (on Ray with `workers` / `ray_address`).
    Trace: `rate` requests/s (inf: all at once; None: the trace's own times),
    `max_requests`, `seed`. Steps: `calibration` (None: the GPU's shipped profile,
    "roofline", a profile or its file), `weights` (a `Weights`) or `weights_bytes`
    and `active_params`, `admission`, `padding_reservation`. Cold tiers:
    `host_memory` (one size or a list, one run per size), `disk`, `host_rule`,
    `ranks_per_node`, `preemption` (recompute, suspend), `host_bandwidth` /
    `disk_bandwidth` (GB/s), `transfer_overlap`. `hash_lookahead` L: each page's
    digest also covers the L ids after it, as vLLM 0.33 hashes blocks with an
    EAGLE-family drafter (a hit needs them equal too). `reuse=False` turns
    prefix reuse off (a preempted request then recomputes from its first token). `progress` is called with each
    run's `Progress`; `on_step` with the manager after each step (to publish its
    events). `options` also take the `PlanKeywords`. Raises KvpoolError on bad
    input, before any run."""
    return Simulation.of(model, gpu=gpu, trace=trace, **options).run(progress=progress, on_step=on_step)
