"""SGLang 0.5.23: separate token pools fixed at start.

Rules modelled (facts read from SGLang 0.5.23's source; no SGLang code is used
here, and tests/test_engines_truth.py checks every number against SGLang's own
pool configurator):

- Full attention only: `max_total_num_tokens = memory // cell_size`, rounded
  down to the page size; `cell_size` is the bytes of one position over every
  layer (MLA rows and the sparse-attention indexer's FP8 key + scale included).
- Sliding + full gets a hybrid SWA pool only for the architectures SGLang lists
  (`is_hybrid_swa_model`: gpt-oss, Llama 4, Gemma 4, MiMo-V2, ...); other sliding
  models (Gemma 2/3, Mistral) keep every layer in the full pool. The SWA pool holds
  `--swa-full-tokens-ratio` (default 0.8) x the full pool's tokens whatever the layer mix:
  `full = memory // (full_bytes + ratio * swa_bytes)`, `swa = int(full * ratio)`,
  both page-aligned; refused when `sliding_window + page_size >= swa`
  (a one-request SWA pool can hang warmup). Chunked local
  attention (Llama 4) is sized the same way with the chunk as its window.
- Mamba / linear-attention state: `mamba = memory * r / (1 + r)` with
  `--mamba-full-memory-ratio` r (default 0.9) buys `(mamba - state) // state`
  slots and one padding slot; the rest goes to the full pool (read from
  `_handle_max_mamba_cache`, not checked against SGLang's code: its CPU build
  refuses the default Mamba scheduling).
- Requests (`resolve_max_num_reqs`): `--max-running-requests`, else
  `min(max(int(full / context_len * 512), 2048), 4096)`, never above half the
  full pool's tokens, capped by the state slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvpool.engines.common import (
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    Sizing,
    allocate_with,
    member,
    refuse_kinds,
)
from kvpool.errors import LimitsError
from kvpool.plan.limits import ServingLimits
from kvpool.spec import LayerGroup, ModelSpec, decode_worst_case_pages

VERSION = "SGLang 0.5.23"
SOURCES = (
    "checked against SGLang 0.5.23's own pool configurator (the sglang==0.5.23 wheel): tests/test_engines_truth.py",
    "python/sglang/srt/configs/model_config.py: is_hybrid_swa_model (the architectures with an SWA pool)",
    "python/sglang/srt/mem_cache/kv_cache_configurator.py: config_from_budget, resolve_max_num_reqs",
    "python/sglang/srt/model_executor/pool_configurator.py: DefaultPoolConfigurator, "
    "HybridSWAPoolConfigurator (full/SWA split, the one-request SWA refusal)",
    "python/sglang/srt/model_executor/model_runner.py: handle_max_mamba_cache (mamba_full_memory_ratio), "
    "max_num_reqs default",
    "python/sglang/srt/mem_cache/memory_pool.py, swa_memory_pool.py: one pool per attention kind, "
    "'KV Cache is allocated. #tokens'",
    "python/sglang/srt/managers/tp_worker.py: max_running_requests",
)
RELEASE = "0.5.23"
RELEASES = (RELEASE,)
# the attention kinds this model sizes (any other is refused by name: engines.common.refuse_kinds)
KINDS = frozenset({"full", "sliding", "chunked", "state"})
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
# Architectures SGLang 0.5.23 gives a hybrid SWA pool (configs/model_config.py:
# is_hybrid_swa_model); every other model's sliding layers are sized as full attention.
HYBRID_SWA_ARCHS = frozenset(
    {
        "BeamForCausalLM",
        "Llama4ForConditionalGeneration",
        "DeepseekV4ForCausalLM",
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "IQuestQ1ForCausalLM",
        "MiMoV2ForCausalLM",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
        "LagunaForCausalLM",
        "MellumForCausalLM",
    }
)
# The same models by config model_type (kvpool's presets keep no `architectures`).
HYBRID_SWA_MODEL_TYPES = frozenset(
    {"gpt_oss", "llama4", "llama4_text", "deepseek_v4", "gemma4", "gemma4_text", "mimo_v2_flash", "step3p5", "laguna"}
)


def has_hybrid_swa_pool(config: Mapping[str, Any]) -> bool:
    """Whether SGLang gives this model a hybrid SWA pool (an unidentified config:
    assumed yes, as kvpool's bundled Gemma 4 and Llama 4 presets are)."""
    archs = config.get("architectures") or ()
    kind = config.get("model_type")
    if not archs and not kind:
        return True
    return bool(HYBRID_SWA_ARCHS.intersection(archs)) or kind in HYBRID_SWA_MODEL_TYPES


DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
GIB = 1 << 30


def _gb(n: int) -> str:
    return f"{n / GIB:.2f} GB"


def pool_layers(spec: ModelSpec) -> tuple[list[LayerGroup], list[LayerGroup], list[LayerGroup], list[str]]:
    """(full, SWA, state) layer groups as SGLang pools them, and notes: sliding
    layers of a model without a hybrid SWA pool (or with no full layers) are
    sized as full attention; several windows, or sliding with state layers,
    are not modelled (`EngineNotModelledError`)."""
    full = [g for g in spec.groups if g.kind == "full"]
    swa = [g for g in spec.groups if g.kind in ("sliding", "chunked")]
    states = [g for g in spec.groups if g.kind == "state"]
    notes = []
    if len({(g.kind, g.window) for g in swa}) > 1:
        raise EngineNotModelledError(
            f"{spec.name}: SGLang keeps one sliding window; groups {[g.name for g in swa]} have several"
        )
    if swa and not has_hybrid_swa_pool(spec.config):
        notes.append(
            f"{spec.config.get('model_type')} has no hybrid SWA pool in SGLang: its sliding layers "
            "keep KV for every position (sized as full attention)"
        )
        full, swa = full + swa, []
    if swa and not full and not states:
        notes.append(
            "no full-attention layers: SGLang does not use a hybrid SWA pool for this model; sized as full attention"
        )
        full, swa = swa, []
    if swa and states:
        raise EngineNotModelledError(f"{spec.name}: sliding and state layers together are not modelled")
    return full, swa, states, notes


@dataclass(frozen=True)
class SglangSizing(Sizing):
    """SGLang's sizing: tokens of the full and SWA pools, mamba slots, request caps."""

    full: tuple[LayerGroup, ...] = ()
    swa: tuple[LayerGroup, ...] = ()
    states: tuple[LayerGroup, ...] = ()
    full_tokens: int = 0
    swa_tokens: int = 0
    slots: int = 0
    ratio: float = 0.0
    max_num_reqs: int = 0
    running: int = 0


@dataclass(frozen=True)
class Sglang:
    """SGLang's allocation rules with its options (`EngineModel`)."""

    page_size: int = 1
    swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO
    mamba_full_memory_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    max_mamba_cache_size: int | None = None
    engine: str = "sglang"
    release: str = RELEASE
    sources: tuple[str, ...] = SOURCES

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> SglangSizing:
        """Pool tokens and slots from the KV budget; start-up refusals."""
        page_size = self.page_size
        if not self.swa_full_tokens_ratio > 0 or not self.mamba_full_memory_ratio > 0 or page_size < 1:
            raise LimitsError("swa_full_tokens_ratio, mamba_full_memory_ratio and page_size must be positive")
        refuse_kinds(spec, KINDS, "SGLang")
        full, swa, states, notes = pool_layers(spec)
        notes.insert(
            0,
            f"{spec.name}: context_len {limits.max_seq_len}, chunked_prefill_size {limits.max_num_tokens}, "
            f"page_size {page_size}",
        )
        base = SglangSizing(spec, limits, kv_memory_bytes, notes=tuple(notes))
        rest, slots = kv_memory_bytes, 0
        if states:
            slots, rest = self.mamba_slots(kv_memory_bytes, sum(g.state_bytes for g in states))
            if slots < 1 or rest <= 0:
                return replace(
                    base,
                    refusals=(
                        "Not enough memory for the mamba state pool. Please try to increase --mem-fraction-static.",
                    ),
                )
        ratio = self.swa_full_tokens_ratio if swa else 0.0
        cell = sum(g.row_bytes for g in full) + ratio * sum(g.row_bytes for g in swa)
        full_tokens = int(rest // cell) // page_size * page_size
        if self.max_total_tokens is not None:
            full_tokens = min(full_tokens, self.max_total_tokens) // page_size * page_size
        if full_tokens <= 0:
            return replace(base, refusals=("Not enough memory. Please try to increase --mem-fraction-static.",))
        swa_tokens = int(full_tokens * ratio) // page_size * page_size if swa else 0
        refusals, degradations = self.swa_checks(swa, swa_tokens, limits) if swa else ([], [])
        max_num_reqs = self.max_num_reqs(full_tokens, slots if states else None, limits, degradations)
        if full_tokens < limits.max_seq_len:
            degradations.append(
                f"the full pool ({full_tokens} tokens) is shorter than context_len "
                f"{limits.max_seq_len}: longer requests are rejected"
            )
        return replace(
            base,
            full=tuple(full),
            swa=tuple(swa),
            states=tuple(states),
            full_tokens=full_tokens,
            swa_tokens=swa_tokens,
            slots=slots,
            ratio=ratio,
            max_num_reqs=max_num_reqs,
            running=max_num_reqs,
            refusals=tuple(refusals),
            degradations=tuple(degradations),
        )

    def mamba_slots(self, kv_memory_bytes: int, state_bytes: int) -> tuple[int, int]:
        """(state slots, bytes left for the token pools): `_handle_max_mamba_cache`,
        whose state pool keeps one padding slot beyond its max_mamba_cache_size,
        both in the ratio's budget and in what it takes."""
        budget = kv_memory_bytes * self.mamba_full_memory_ratio / (1 + self.mamba_full_memory_ratio)
        slots = (
            int((budget - state_bytes) // state_bytes)
            if self.max_mamba_cache_size is None
            else self.max_mamba_cache_size
        )
        return slots, kv_memory_bytes - (slots + 1) * state_bytes

    def swa_checks(self, swa: list[LayerGroup], swa_tokens: int, limits: ServingLimits) -> tuple[list[str], list[str]]:
        """(refusals, degradations) of an SWA pool of `swa_tokens`: the
        one-request refusal (the prefill admission floor is window + page
        size) and CUDA-graph decode batches the pool cannot hold at full window."""
        page_size, refusals, degradations = self.page_size, [], []
        window = swa[0].window
        assert window is not None
        if window + page_size >= swa_tokens:
            refusals.append(
                f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill "
                f"admission floor is sliding_window_size ({window}) + page_size ({page_size}). "
                "Increase --swa-full-tokens-ratio or the total KV budget."
            )
        probe = member("swa", swa[0].kind, page_size, window=window)
        per = decode_worst_case_pages(probe, limits.headroom) or 1
        graph = limits.largest_graph_batch
        if graph * per > swa_tokens // page_size:
            degradations.append(
                f"the SWA pool holds {swa_tokens // page_size // per} full-window decodes "
                f"but the largest CUDA-graph batch is {graph}: decode batches beyond that "
                "wait or are retracted"
            )
        return refusals, degradations

    def max_num_reqs(self, full_tokens: int, slots: int | None, limits: ServingLimits, notes: list[str]) -> int:
        """`resolve_max_num_reqs`: the request cap, or an estimate from the
        pool, never above half the pool's tokens; the mamba state `slots` cap
        it too (appending a degradation to `notes` when they cut the cap)."""
        cap = self.max_running_requests
        estimated = max(min(int(full_tokens / limits.max_seq_len * 512), 4096), 2048)
        max_num_reqs = min(cap or estimated, full_tokens // 2)
        if slots is None:
            return max_num_reqs
        if cap is not None and slots < cap:
            notes.append(f"max_running_requests {cap} capped at {slots} by the mamba state pool")
        return min(max_num_reqs, slots)

    def pools(self, sizing: SglangSizing) -> tuple[EnginePool, ...]:
        """The full pool, the SWA pool and the mamba state pool that sizing buys."""
        if sizing.full_tokens <= 0:
            return ()
        page_size = self.page_size
        full_bytes = sum(g.row_bytes for g in sizing.full)
        pools = [
            EnginePool(
                "full",
                page_size,
                full_bytes * page_size,
                sizing.full_tokens // page_size,
                tuple(g.name for g in sizing.full),
                (member("full", "full", page_size),),
                sizing.full_tokens,
            )
        ]
        if sizing.swa:
            pools.append(
                EnginePool(
                    "swa",
                    page_size,
                    sum(g.row_bytes for g in sizing.swa) * page_size,
                    sizing.swa_tokens // page_size,
                    tuple(g.name for g in sizing.swa),
                    (member("swa", sizing.swa[0].kind, page_size, window=sizing.swa[0].window),),
                    sizing.swa_tokens,
                )
            )
        if sizing.states:
            pools.append(
                EnginePool(
                    "mamba",
                    0,
                    sum(g.state_bytes for g in sizing.states),
                    sizing.slots,
                    tuple(g.name for g in sizing.states),
                    (member("mamba", "state", 1),),
                    None,
                )
            )
        return tuple(pools)

    def report(self, sizing: SglangSizing, pools: tuple[EnginePool, ...]) -> EngineReport:
        """SGLang's allocation log lines and the numbers behind them."""
        limits = sizing.limits
        base = EngineReport(
            "sglang",
            VERSION,
            self.sources,
            limits,
            sizing.budget_bytes,
            pools,
            refusals=sizing.refusals,
            degradations=sizing.degradations,
            notes=sizing.notes,
        )
        if not pools:
            return base
        lines: list[str] = []
        if sizing.swa:
            lines.append(
                f"Use sliding window memory pool. full_layer_tokens={sizing.full_tokens}, "
                f"swa_layer_tokens={sizing.swa_tokens}"
            )
        lines += [_allocated_line(p) for p in pools]
        lines.append(
            f"max_total_num_tokens={sizing.full_tokens}, chunked_prefill_size={limits.max_num_tokens}, "
            f"max_running_requests={sizing.running}, context_len={limits.max_seq_len}"
        )
        reported: dict[str, int | float | None] = {
            "full_tokens": sizing.full_tokens,
            "swa_tokens": sizing.swa_tokens if sizing.swa else None,
            "max_mamba_cache_size": sizing.slots if sizing.states else None,
            "max_running_requests": sizing.running,
            "max_num_reqs": sizing.max_num_reqs,
            "page_size": self.page_size,
            "swa_full_tokens_ratio": sizing.ratio if sizing.swa else None,
        }
        return replace(base, reported=reported, lines=tuple(lines), group_pages=_group_pages(sizing))


def allocate(
    spec: ModelSpec,
    limits: ServingLimits,
    kv_memory_bytes: int,
    *,
    page_size: int = 1,
    swa_full_tokens_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO,
    mamba_full_memory_ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    max_running_requests: int | None = None,
    max_total_tokens: int | None = None,
    max_mamba_cache_size: int | None = None,
) -> EngineReport:
    """What SGLang would allocate from `kv_memory_bytes` (the memory left for
    the KV pools after --mem-fraction-static) at --context-length L and
    --chunked-prefill-size N. `max_total_tokens` caps the full pool as the flag
    does. Refusals are reported; `EngineNotModelledError` for layouts kvpool
    does not model."""
    model = Sglang(
        page_size,
        swa_full_tokens_ratio,
        mamba_full_memory_ratio,
        max_running_requests,
        max_total_tokens,
        max_mamba_cache_size,
    )
    return allocate_with(model, spec, limits, kv_memory_bytes)


def _allocated_line(p: EnginePool) -> str:
    """SGLang's log line for one allocated pool (a KV pool's K and V halves, or the Mamba cache)."""
    if p.tokens is None:
        return f"Mamba Cache is allocated. max_mamba_cache_size: {p.pages}, size: {_gb(p.pages * p.page_bytes)}"
    half = _gb((p.tokens + p.page_tokens) * (p.page_bytes // p.page_tokens) // 2)
    return f"KV Cache is allocated. #tokens: {p.tokens}, K size: {half}, V size: {half}"


def _group_pages(sizing: SglangSizing) -> dict[str, int]:
    """Pages (state slots) per group of the spec in SGLang's pools."""
    tpb = sizing.spec.tokens_per_block
    group_pages = {g.name: sizing.full_tokens // tpb for g in sizing.full}
    group_pages.update({g.name: sizing.swa_tokens // tpb for g in sizing.swa})
    group_pages.update({g.name: sizing.slots for g in sizing.states})
    return group_pages
