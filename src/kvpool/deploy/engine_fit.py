"""`kvpool fit`, per engine: from one kvpool plan on the whole GPU, what vLLM,
SGLang and TensorRT-LLM would do when launched to follow it — the verdict, the
budget flags in the engine's own convention, the KV per rank, the requests that
fit at once, the CUDA-graph batch sizes that keep graphs, and the launch line.

Budget conventions (each engine's own knob for the same KV bytes K per rank, on
a GPU of G bytes holding weights W per rank):

- vLLM: `--gpu-memory-utilization U` is kvpool's own convention (deploy/budget.py:
  K = G x U - weights - activations - CUDA graphs - reserve); the exact
  `--kv-cache-memory-bytes K` replaces the profiling (vLLM's engine arguments).
- SGLang: the pools get `total x --mem-fraction-static - W` (model_runner's
  `profile_max_num_token`: rest = available after the weights - total x (1 - F)),
  so F = (K + W) / G, rounded up to 3 digits so the pools reach K (SGLang's
  total is the memory free at start, a little under G) and `--max-total-tokens`
  caps the full pool at the plan's tokens exactly; the 0.1 x G that the 0.9 leaves
  out of K, activations and graphs keeps SGLang's own headroom.
- TensorRT-LLM: `kv_cache_config.max_gpu_total_bytes: K` (the LLM API's
  KvCacheConfig; `free_gpu_memory_fraction`, default 0.9 of the memory free after
  the weights, applies as well, and the smaller of the two wins).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.engines.common import EngineNotModelledError, EngineReport
from kvpool.engines.emit import Emitted, emit
from kvpool.plan import PoolPlan
from kvpool.plan.batches import REFERENCE_REQUEST, decode_shape
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.tiers import TierPlan
from kvpool.units import format_bytes

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
# What each engine does with a decode batch and its captured sizes (vLLM's
# CompilationConfig.cudagraph_capture_sizes, SGLang's --cuda-graph-bs / cuda_graph_max_bs,
# TensorRT-LLM's CudaGraphConfig.batch_sizes and enable_padding).
GRAPH_RULES = {
    "vllm": "batches up to {top} run on graphs ({n} sizes, a batch padded up to the next one); larger run eager",
    "sglang": "batches up to {top} (cuda_graph_max_bs, {n} sizes) run on graphs; larger run eager",
    "trtllm": "batches of a captured size up to {top} run on graphs ({n} sizes; others too with "
    "cuda_graph_config.enable_padding: true); larger run eager",
}


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
            "tiers": [t.to_json() for t in self.tiers],
        }


def sglang_fraction(kv_bytes: int, memory: MemoryBudget) -> float:
    """SGLang's --mem-fraction-static for K bytes of pools on this GPU (module docstring)."""
    return math.ceil(1000 * (kv_bytes + memory.weights_bytes) / memory.gpu_bytes) / 1000


def budget_flags(engine: str, kv_bytes: int, memory: MemoryBudget | None) -> tuple[str, ...]:
    """The engine's own flags for K bytes of KV per rank (module docstring)."""
    if engine == "vllm":
        exact = f"--kv-cache-memory-bytes {kv_bytes}"
        return (f"--gpu-memory-utilization {memory.utilization:g}", exact) if memory else (exact,)
    if engine == "sglang":
        return (f"--mem-fraction-static {sglang_fraction(kv_bytes, memory):.3f}",) if memory else ()
    return (f"kv_cache_config.max_gpu_total_bytes: {kv_bytes}",)


def with_budget_flag(emitted: Emitted, memory: MemoryBudget | None) -> Emitted:
    """SGLang's launch with its --mem-fraction-static when the whole-GPU breakdown
    is known: the fraction replaces the "leave at least ..." note, SGLang sizes from it."""
    if emitted.engine != "sglang" or memory is None or emitted.argv is None:
        return emitted
    flag = budget_flags("sglang", emitted.report.budget_bytes, memory)[0]
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
    name = ENGINE_NAMES[engine]
    if not sizes:
        return sizes, f"{name}: no CUDA graph fits the request cap {cap}: every step runs eager"
    top = sizes[-1]
    line = f"{name}: " + GRAPH_RULES[engine].format(top=top, n=len(sizes))
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
    tiers: Sequence[TierPlan] = (),
) -> EngineFit:
    """What `engine` does when launched to follow `plan` (whose budget is the KV
    bytes per rank); `memory` the whole-GPU breakdown when the budget came from it;
    `tiers` one rank's cold tiers, stated as the engine's offload flags."""
    flags = budget_flags(engine, plan.budget_bytes, memory)
    try:
        emitted = emit(engine, plan, model_id, tiers)
    except EngineNotModelledError as e:  # the other engines still answer
        note = f"{ENGINE_NAMES[engine]}: not modelled"
        return EngineFit(engine, False, (str(e),), flags, plan.budget_bytes, {}, lengths, (), note, None)
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
    kv = plan.budget_bytes
    return EngineFit(engine, not reasons, tuple(reasons), flags, kv, fits, lengths, sizes, note, emitted, tuple(tiers))
