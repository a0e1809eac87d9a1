"""SGLang: separate token pools fixed at start.

Rules modelled (facts read from SGLang's source; no SGLang code is used):

- Full attention only: `max_total_num_tokens = memory // cell_size`, rounded
  down to the page size; `cell_size` is the bytes of one position over every
  layer (MLA rows and the sparse-attention indexer's FP8 key + scale included).
- Sliding + full (hybrid SWA): the SWA pool holds `--swa-full-tokens-ratio`
  (default 0.8) x the full pool's tokens whatever the layer mix:
  `full = memory // (full_bytes + ratio * swa_bytes)`, `swa = int(full * ratio)`,
  both page-aligned; refused when `sliding_window + page_size >= swa`
  (a one-request SWA pool can hang warmup). Chunked local
  attention (Llama 4) is sized the same way with the chunk as its window.
- Mamba / linear-attention state: `mamba = memory * r / (1 + r)` with
  `--mamba-full-memory-ratio` r (default 0.9) buys `mamba // state_bytes` slots;
  the rest goes to the full pool.
- Requests: `max_num_reqs = --max-running-requests`, else
  `min(max(int(full / context_len * 512), 2048), 4096)`, capped by the state slots;
  the running cap is `min(--max-running-requests or full // 2, max_num_reqs)`.
"""

from __future__ import annotations

from dataclasses import replace

from kvpool.engines.common import (
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    member,
    refuse_compressed,
)
from kvpool.errors import LimitsError
from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec, decode_worst_case_pages

VERSION = "SGLang main branch at commit 003fca80 (2026)"
SOURCES = (
    "python/sglang/srt/model_executor/pool_configurator.py: DefaultPoolConfigurator, "
    "HybridSWAPoolConfigurator (full/SWA split, the one-request SWA refusal)",
    "python/sglang/srt/model_executor/model_runner.py: handle_max_mamba_cache (mamba_full_memory_ratio), "
    "max_num_reqs default",
    "python/sglang/srt/mem_cache/memory_pool.py, swa_memory_pool.py: one pool per attention kind, "
    "'KV Cache is allocated. #tokens'",
    "python/sglang/srt/managers/tp_worker.py: max_running_requests",
)
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
GIB = 1 << 30


def _gb(n: int) -> str:
    return f"{n / GIB:.2f} GB"


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
    if kv_memory_bytes < 1:
        raise LimitsError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}")
    if not swa_full_tokens_ratio > 0 or not mamba_full_memory_ratio > 0 or page_size < 1:
        raise LimitsError("swa_full_tokens_ratio, mamba_full_memory_ratio and page_size must be positive")
    refuse_compressed(spec, "SGLang")
    full = [g for g in spec.groups if g.kind == "full"]
    swa = [g for g in spec.groups if g.kind in ("sliding", "chunked")]
    states = [g for g in spec.groups if g.kind == "state"]
    notes = [
        f"{spec.name}: context_len {limits.max_seq_len}, chunked_prefill_size {limits.max_num_tokens}, "
        f"page_size {page_size}"
    ]
    if len({(g.kind, g.window) for g in swa}) > 1:
        raise EngineNotModelledError(
            f"{spec.name}: SGLang keeps one sliding window; groups {[g.name for g in swa]} have several"
        )
    if swa and not full and not states:
        notes.append(
            "no full-attention layers: SGLang does not use a hybrid SWA pool for this model; sized as full attention"
        )
        full, swa = swa, []
    if swa and states:
        raise EngineNotModelledError(f"{spec.name}: sliding and state layers together are not modelled")
    full_bytes = sum(g.row_bytes for g in full)
    swa_bytes = sum(g.row_bytes for g in swa)
    state_bytes = sum(g.state_bytes for g in states)
    base = EngineReport("sglang", VERSION, SOURCES, limits, kv_memory_bytes, (), notes=tuple(notes))
    rest, slots = kv_memory_bytes, 0
    if states:
        if max_mamba_cache_size is None:
            budget = kv_memory_bytes * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)
            max_mamba_cache_size = int(budget // state_bytes)
        slots = max_mamba_cache_size
        rest = kv_memory_bytes - slots * state_bytes
        if slots < 1 or rest <= 0:
            return replace(
                base,
                refusals=("Not enough memory for the mamba state pool. Please try to increase --mem-fraction-static.",),
            )
    ratio = swa_full_tokens_ratio if swa else 0.0
    cell = full_bytes + ratio * swa_bytes
    full_tokens = int(rest // cell) // page_size * page_size
    if max_total_tokens is not None:
        full_tokens = min(full_tokens, max_total_tokens) // page_size * page_size
    if full_tokens <= 0:
        return replace(base, refusals=("Not enough memory. Please try to increase --mem-fraction-static.",))
    swa_tokens = int(full_tokens * ratio) // page_size * page_size if swa else 0
    refusals: list[str] = []
    degradations: list[str] = []
    lines: list[str] = []
    window = swa[0].window if swa else None
    if swa:
        assert window is not None
        if window + page_size >= swa_tokens:
            refusals.append(
                f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill "
                f"admission floor is sliding_window_size ({window}) + page_size ({page_size}). "
                "Increase --swa-full-tokens-ratio or the total KV budget."
            )
        lines.append(f"Use sliding window memory pool. full_layer_tokens={full_tokens}, swa_layer_tokens={swa_tokens}")
    pools = [
        EnginePool(
            "full",
            page_size,
            full_bytes * page_size,
            full_tokens // page_size,
            tuple(g.name for g in full),
            (member("full", "full", page_size),),
            full_tokens,
        )
    ]
    lines.append(
        f"KV Cache is allocated. #tokens: {full_tokens}, K size: "
        f"{_gb((full_tokens + page_size) * full_bytes // 2)}, "
        f"V size: {_gb((full_tokens + page_size) * full_bytes // 2)}"
    )
    if swa:
        kind = swa[0].kind
        pools.append(
            EnginePool(
                "swa",
                page_size,
                swa_bytes * page_size,
                swa_tokens // page_size,
                tuple(g.name for g in swa),
                (member("swa", kind, page_size, window=window),),
                swa_tokens,
            )
        )
        lines.append(
            f"KV Cache is allocated. #tokens: {swa_tokens}, K size: "
            f"{_gb((swa_tokens + page_size) * swa_bytes // 2)}, "
            f"V size: {_gb((swa_tokens + page_size) * swa_bytes // 2)}"
        )
        probe = member("swa", kind, page_size, window=window)
        per = decode_worst_case_pages(probe, limits.headroom) or 1
        graph = limits.largest_graph_batch
        if graph * per > swa_tokens // page_size:
            degradations.append(
                f"the SWA pool holds {swa_tokens // page_size // per} full-window decodes "
                f"but the largest CUDA-graph batch is {graph}: decode batches beyond that "
                "wait or are retracted"
            )
    if states:
        pools.append(
            EnginePool(
                "mamba", 0, state_bytes, slots, tuple(g.name for g in states), (member("mamba", "state", 1),), None
            )
        )
        lines.append(f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, size: {_gb(slots * state_bytes)}")
    max_num_reqs = max_running_requests or min(max(int(full_tokens / limits.max_seq_len * 512), 2048), 4096)
    if states:
        if max_running_requests is not None and slots < max_running_requests:
            degradations.append(
                f"max_running_requests {max_running_requests} capped at {slots} by the mamba state pool"
            )
        max_num_reqs = min(max_num_reqs, slots)
    running = min(max_running_requests or full_tokens // 2, max_num_reqs)
    if full_tokens < limits.max_seq_len:
        degradations.append(
            f"the full pool ({full_tokens} tokens) is shorter than context_len "
            f"{limits.max_seq_len}: longer requests are rejected"
        )
    lines.append(
        f"max_total_num_tokens={full_tokens}, chunked_prefill_size={limits.max_num_tokens}, "
        f"max_running_requests={running}, context_len={limits.max_seq_len}"
    )
    reported: dict[str, int | float | None] = {
        "full_tokens": full_tokens,
        "swa_tokens": swa_tokens if swa else None,
        "max_mamba_cache_size": slots if states else None,
        "max_running_requests": running,
        "max_num_reqs": max_num_reqs,
        "page_size": page_size,
        "swa_full_tokens_ratio": ratio if swa else None,
    }
    tpb = spec.tokens_per_block
    group_pages = {g.name: full_tokens // tpb for g in full}
    group_pages.update({g.name: swa_tokens // tpb for g in swa})
    group_pages.update({g.name: slots for g in states})
    return replace(
        base,
        pools=tuple(pools),
        reported=reported,
        lines=tuple(lines),
        refusals=tuple(refusals),
        degradations=tuple(degradations),
        group_pages=group_pages,
    )
