"""The smallest fleet for an SLO (`kvpool fit MODEL --gpu G --trace T --slo
ttft_p99=2s,itl_p99=50ms`): the fewest GPUs, and the layout on them (TP,
replicas or prefill:decode, router), whose fleet meets the SLO on the trace.

The candidates are every layout of 1..`max_gpus` GPUs: for each TP size the
model fits at (an engine of TP GPUs), N aggregated replicas behind each router,
and every P:D split of N engines behind the first router (disaggregation needs
two engines at least). They are tried by GPU count, fewest first; all the
candidates of one count run (as Ray tasks with `workers` / `ray_address`, the
same results as serially: every run is a pure function of its inputs), and the
search stops at the first count where one meets the SLO. The answer is the one
with the most goodput there; the runner-up is the next best one that meets it
there, else the best of the count below, with why it lost. `evaluate` is
pluggable (a test's fake fleet); it must be a module-level function for Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from kvpool import presets
from kvpool.deploy.fleets import FleetLayout, FleetSimulation
from kvpool.deploy.gpus import split_gpu
from kvpool.deploy.simulation import SimulateKeywords
from kvpool.errors import KvpoolError, flagged
from kvpool.fleet import handoff_link
from kvpool.fleet.metrics import Slo
from kvpool.sim.serial_or_ray import Bar, run_all

DEFAULT_ROUTERS = ("kv", "round-robin")
DEFAULT_TPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Evaluation:
    """What one candidate's fleet measured: whether it met the SLO, what it
    missed, its goodput and the fleet's JSON (no wall-clock time in it)."""

    layout: FleetLayout
    meets: bool
    misses: tuple[str, ...]
    goodput_rps: float
    output_tokens_per_s: float
    fleet: dict[str, Any]

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.label,
            "gpus": self.gpus,
            "tp": self.layout.tp,
            "meets": self.meets,
            "misses": list(self.misses),
            "goodput_rps": self.goodput_rps,
            "output_tokens_per_s": self.output_tokens_per_s,
        }


@dataclass(frozen=True)
class FleetTask:
    """One candidate to run: the fleet's set-up at its TP, with its layout."""

    setup: FleetSimulation
    layout: FleetLayout


def run_candidate(task: FleetTask) -> Evaluation:
    """Run one candidate's fleet (module-level: Ray runs it)."""
    setup = task.setup
    result = setup.run_layout(task.layout, setup.plan)
    return Evaluation(
        task.layout,
        result.meets(),
        tuple(result.misses()),
        result.goodput(),
        result.output_tokens_per_s,
        result.to_dict(),
    )


def candidates(
    tps: Sequence[int], max_gpus: int, routers: Sequence[str], disaggregated: bool = True
) -> list[FleetLayout]:
    """Every layout of at most `max_gpus` GPUs (module docstring), fewest GPUs
    first, then aggregated before disaggregated, fewer prefill engines first, routers in order."""
    out = []
    for tp in tps:
        for n in range(1, max_gpus // tp + 1):
            out += [FleetLayout(n, r, tp=tp) for r in routers]
            if disaggregated and n >= 2:
                out += [FleetLayout(1, routers[0], prefill=p, decode=n - p, tp=tp) for p in range(1, n)]
    return sorted(out, key=lambda c: (c.gpus, c.disaggregated, c.tp, c.prefill))


@dataclass(frozen=True)
class FleetFit:
    """The search's answer: `best` (None when nothing up to the limit meets the
    SLO), `runner_up` and why it lost, every evaluation in the order tried."""

    slo: Slo
    best: Evaluation | None
    runner_up: Evaluation | None
    why: str
    evaluations: tuple[Evaluation, ...]
    notes: tuple[str, ...] = ()

    def goodput_by_gpus(self) -> list[tuple[int, float, bool]]:
        """(GPUs, the best goodput at that count, whether any met the SLO) for the plot."""
        out: dict[int, tuple[float, bool]] = {}
        for e in self.evaluations:
            best, met = out.get(e.gpus, (0.0, False))
            out[e.gpus] = (max(best, e.goodput_rps), met or e.meets)
        return [(g, *out[g]) for g in sorted(out)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "slo": str(self.slo),
            "best": None if self.best is None else {**self.best.to_dict(), "fleet": self.best.fleet},
            "runner_up": None if self.runner_up is None else self.runner_up.to_dict(),
            "why": self.why,
            "candidates": [e.to_dict() for e in self.evaluations],
            "notes": list(self.notes),
        }


def choose(evaluations: Sequence[Evaluation]) -> tuple[Evaluation | None, Evaluation | None, str]:
    """The best, the runner-up and why it lost (module docstring)."""
    met = [e for e in evaluations if e.meets]
    if not met:
        near = max(evaluations, key=lambda e: (e.gpus, e.goodput_rps), default=None)
        why = "" if near is None else f"the largest tried, {near.layout.label}, misses {'; '.join(near.misses)}"
        return None, near, why
    gpus = min(e.gpus for e in met)
    at = sorted((e for e in met if e.gpus == gpus), key=lambda e: -e.goodput_rps)  # stable: ties keep the order tried
    return (at[0], *runner_up(at, evaluations))


def runner_up(at: Sequence[Evaluation], evaluations: Sequence[Evaluation]) -> tuple[Evaluation | None, str]:
    """The runner-up to `at[0]` and why it lost: another that meets the SLO on
    as few GPUs (`at`, best first), else the largest on fewer GPUs, else the
    best of the rest."""
    best, gpus = at[0], at[0].gpus
    if len(at) > 1:
        r = at[1]
        return r, (
            f"also meets the SLO on {gpus} GPUs, with less goodput ({r.goodput_rps:.3g} vs {best.goodput_rps:.3g} requests/s)"
        )
    below = [e for e in evaluations if e.gpus < gpus]
    if below:
        r = max(below, key=lambda e: (e.gpus, e.goodput_rps))
        return r, f"{r.gpus} GPUs: misses {'; '.join(r.misses)}"
    others = [e for e in evaluations if e is not best]
    if others:
        r = max(others, key=lambda e: e.goodput_rps)
        return r, f"misses {'; '.join(r.misses)}"
    return None, ""


def fit_fleet(
    model: str,
    *,
    gpu: str,
    trace: Any,
    slo: Slo | str,
    max_gpus: int = 8,
    tps: Sequence[int] | None = None,
    routers: Sequence[str] = DEFAULT_ROUTERS,
    disaggregated: bool = True,
    link: str | None = None,
    progress: bool = False,
    evaluate: Callable[[FleetTask], Evaluation] = run_candidate,
    **options: Unpack[SimulateKeywords],
) -> FleetFit:
    """The fewest GPUs (at most `max_gpus`) of `gpu` and the layout on them
    whose fleet meets `slo` on `trace` (module docstring). `tps`: the TP sizes
    to try (default 1, 2, 4, 8 where the model fits); `routers`; `disaggregated`
    adds the P:D splits (over `link`); `options`: `simulate`'s keywords for
    one replica, but `workers` / `ray_address` run the candidates (Ray).
    Raises KvpoolError on bad input, before any run."""
    values: dict[str, Any] = dict(options)
    workers, ray_address = values.pop("workers", None), values.pop("ray_address", None)
    slo = check_search(slo, gpu=gpu, max_gpus=max_gpus, disaggregated=disaggregated, link=link)
    notes: list[str] = []
    setups = engine_setups(model, gpu, trace, slo, max_gpus, tps, notes, values)
    layouts = [
        dataclasses.replace(c, link=link if c.disaggregated else None)
        for c in candidates(sorted(setups), max_gpus, routers, disaggregated)
    ]
    evaluations: list[Evaluation] = []
    how = ""
    for gpus in sorted({c.gpus for c in layouts}):
        tasks = [FleetTask(setups[c.tp], c) for c in layouts if c.gpus == gpus]
        results, how = evaluate_on(gpus, tasks, evaluate, workers=workers, ray_address=ray_address, progress=progress)
        evaluations += results
        if any(e.meets for e in results):
            break
    notes.append(how.replace("points", "candidates"))
    best, second, why = choose(evaluations)
    return FleetFit(slo, best, second, why, tuple(evaluations), tuple(notes))


def check_search(slo: Slo | str, *, gpu: str, max_gpus: int, disaggregated: bool, link: str | None) -> Slo:
    """`fit_fleet`'s arguments checked before any run; the SLO parsed."""
    with flagged("--slo"):
        slo = Slo.parse(slo) if isinstance(slo, str) else slo
    if not slo.bounds:
        raise KvpoolError("--slo names no bound")
    if not 1 <= max_gpus <= 64:
        raise KvpoolError(f"--max-gpus must be 1..64, got {max_gpus}")
    name, count = split_gpu(gpu)
    if count is not None:
        raise KvpoolError(f"--gpu {gpu}: give the GPU without a count (the search picks how many, up to --max-gpus)")
    if disaggregated:
        handoff_link(presets.load_gpu(name), link)  # an unknown link fails before any run
    return slo


def engine_setups(
    model: str,
    gpu: str,
    trace: Any,
    slo: Slo,
    max_gpus: int,
    tps: Sequence[int] | None,
    notes: list[str],
    values: dict[str, Any],
) -> dict[int, FleetSimulation]:
    """One engine's simulation per TP size the model fits at (planned now);
    a default TP it does not fit at is noted in `notes` and skipped, a TP
    given in `tps` raises."""
    setups: dict[int, FleetSimulation] = {}
    for tp in tps or DEFAULT_TPS:
        if tp > max_gpus:
            continue
        try:
            setups[tp] = FleetSimulation.of(
                model, gpu=f"{gpu}x{tp}", trace=trace, layout=FleetLayout(), slo=slo, **values
            )
            setups[tp].plan  # noqa: B018 (a TP the model does not fit at fails here, not in a run)
        except KvpoolError as e:
            if tps is not None:
                raise
            notes.append(f"tp {tp} skipped: {e}")
    if not setups:
        raise KvpoolError(f"{model} fits no engine of at most {max_gpus} {gpu} GPUs: {'; '.join(notes)}")
    return setups


def evaluate_on(
    gpus: int,
    tasks: list[FleetTask],
    evaluate: Callable[[FleetTask], Evaluation],
    *,
    workers: int | None,
    ray_address: str | None,
    progress: bool,
) -> tuple[list[Evaluation], str]:
    """Every candidate of `gpus` GPUs run (on Ray with `workers` /
    `ray_address`), under a progress bar; the results and how they ran."""
    bar = Bar(len(tasks), f"{gpus} GPUs", enabled=progress)
    try:
        return run_all(
            evaluate, tasks, workers=workers, ray_address=ray_address, bar=bar, describe=lambda t: t.layout.label
        )
    finally:
        bar.close()
