"""`fit`, per engine: from one kvpool plan on the whole GPU, what vLLM,
SGLang and TensorRT-LLM would do when launched to follow it — the verdict, the
budget flags in the engine's own convention, the KV per rank, the requests that
fit at once, the CUDA-graph batch sizes that keep graphs, and the launch line.

The budget conventions (each engine's own knob for the same KV bytes per rank)
and what each engine takes by its own defaults are library code
(engines/budgets.py), as is everything else that differs between engines
(engines/registry.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.engines import registry
from kvpool.engines.common import EngineNotModelledError, EngineReport
from kvpool.engines.emit import Emitted
from kvpool.models.weights import Parallel
from kvpool.plan import PoolPlan
from kvpool.plan.batches import REFERENCE_REQUEST, decode_shape
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.tiers import TierPlan
from kvpool.units import format_bytes


@dataclass(frozen=True)
class EngineFit:
    """One engine's answer for one layout (see the module docstring)."""

    engine: str
    starts: bool
    reasons: tuple[str, ...]
    budget_flags: tuple[str, ...]
    kv_bytes: int
    fits: dict[str, int]
    lengths: dict[str, int]
    graph_sizes: tuple[int, ...]
    graph_note: str
    emitted: Emitted | None  # None: kvpool does not model this engine for the model
    own_default: tuple[int, str] | None = None  # (KV bytes per rank, rule) by the engine's own defaults
    tiers: tuple[TierPlan, ...] = ()  # one rank's cold tiers, as this engine sizes its host tier

    @property
    def verdict(self) -> str:
        return "not modelled" if self.emitted is None else "starts" if self.starts else "refuses"

    def to_json(self) -> dict[str, Any]:
        launch = {} if self.emitted is None else self.emitted.to_json()
        report = None if self.emitted is None else self.emitted.report
        return {
            "engine": self.engine,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "budget_flags": list(self.budget_flags),
            "kv_bytes_per_rank": self.kv_bytes,
            "requests_that_fit": self.fits,
            "lengths": self.lengths,
            "cuda_graph_batch_sizes": list(self.graph_sizes),
            "largest_graph_batch": max(self.graph_sizes, default=0),
            "cuda_graphs": self.graph_note,
            "launch": launch.get("argv", launch.get("config")),
            "launch_text": "" if self.emitted is None else self.emitted.text(),
            "notes": [] if self.emitted is None else list(self.emitted.notes),
            "reported": {} if report is None else dict(report.reported),
            "version_modelled": None if report is None else report.version_modelled,
            "own_default": None
            if self.own_default is None
            else {"kv_bytes_per_rank": self.own_default[0], "rule": self.own_default[1]},
            "tiers": [t.to_json() for t in self.tiers],
        }


def with_budget_flag(emitted: Emitted, memory: MemoryBudget | None) -> Emitted:
    """SGLang's launch with its --mem-fraction-static when the whole-GPU breakdown
    is known: the fraction replaces the "leave at least ..." note, SGLang sizes from it."""
    flags = registry.entry(emitted.engine).budget_flags(emitted.report.budget_bytes, memory)
    fraction = [f for f in flags if f.startswith("--mem-fraction-static")]
    if memory is None or emitted.argv is None or not fraction:
        return emitted
    flag = fraction[0]
    notes = tuple(n for n in emitted.notes if not n.startswith("SGLang sizes its pools"))
    return dataclasses.replace(emitted, argv=(*emitted.argv, *flag.split()), notes=notes)


def requests_that_fit(report: EngineReport, plan: PoolPlan, lengths: dict[str, int]) -> dict[str, int]:
    """Requests the engine's pools hold at once, decoding at each named length
    (`reference`: kvpool's reference request, 2049 positions with 2048 computed)."""
    return {
        name: report.max_requests(REFERENCE_REQUEST if name == "reference" else decode_shape(length, plan.limits))
        for name, length in lengths.items()
    }


def fit_lengths(plan: PoolPlan, length: int | None = None) -> dict[str, int]:
    """The lengths that matter: the reference request, --len (when given) and max_seq_len."""
    out = {"reference": REFERENCE_REQUEST[0]}
    if length is not None and length != plan.limits.max_seq_len:
        out["len"] = length
    out["max_seq_len"] = plan.limits.max_seq_len
    return out


def graph_answer(engine: str, report: EngineReport, plan: PoolPlan, at_max: int) -> tuple[tuple[int, ...], str]:
    """(batch sizes captured, one line): the graphs the launch captures (kvpool's
    sizes, capped by the engine's running-request cap), what runs eager, and how
    many requests of max_seq_len can form a batch at all."""
    cap = int(report.reported.get("max_running_requests") or plan.limits.max_batch_size)
    sizes = tuple(b for b in plan.limits.graph_batch_sizes if b <= cap)
    e = registry.entry(engine)
    name = e.title
    if not sizes:
        return sizes, f"{name}: no CUDA graph fits the request cap {cap}: every step runs eager"
    top = sizes[-1]
    line = f"{name}: " + e.graph_rule.format(top=top, n=len(sizes))
    if at_max < top:
        line += (
            f"; at max_seq_len {plan.limits.max_seq_len:,} only {at_max} requests fit at once, so batches "
            f"above {at_max} form only from shorter requests"
        )
    return sizes, line


def engine_fit(
    engine: str,
    plan: PoolPlan,
    model_id: str,
    memory: MemoryBudget | None,
    lengths: dict[str, int],
    parallel: Parallel | None = None,
    tiers: Sequence[TierPlan] = (),
) -> EngineFit:
    """What `engine` does when launched to follow `plan` (whose budget is the KV
    bytes per rank) on `parallel`; `memory` the whole-GPU breakdown when the budget
    came from it, which also gives the KV the engine takes by its own defaults;
    `tiers` one rank's cold tiers, stated as the engine's offload flags."""
    e = registry.entry(engine)
    flags = e.budget_flags(plan.budget_bytes, memory)
    par = parallel or Parallel(tp=plan.spec.tp_size)
    own = None if memory is None else e.default_kv(memory, par.tp, par.pp, plan.limits.max_batch_size)
    try:
        emitted = registry.launch(engine, plan, model_id, tiers, parallel)
    except EngineNotModelledError as err:  # the other engines still answer
        note = f"{e.title}: not modelled"
        return EngineFit(engine, False, (str(err),), flags, plan.budget_bytes, {}, lengths, (), note, None)
    report = emitted.report
    emitted = with_budget_flag(emitted, memory)
    fits = requests_that_fit(report, plan, lengths)
    reasons = list(report.refusals)
    at_max = fits["max_seq_len"]
    if at_max == 0 and not reasons:
        reasons.append(
            f"the pools cannot hold one request of max_seq_len {plan.limits.max_seq_len:,} "
            f"({format_bytes(plan.budget_bytes)} of KV per rank)"
        )
    sizes, note = graph_answer(engine, report, plan, at_max)
    default = None if own is None else (own.kv_bytes, own.rule)
    kv = plan.budget_bytes
    return EngineFit(
        engine, not reasons, tuple(reasons), flags, kv, fits, lengths, sizes, note, emitted, default, tuple(tiers)
    )
