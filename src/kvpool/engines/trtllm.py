"""TensorRT-LLM (PyTorch backend): one block pool per attention window.

Rules modelled (facts read from TensorRT-LLM's source; no TensorRT-LLM code is used):

- V1 manager (C++ `KVCacheManager`, `V1Model`): layers are grouped by attention window (full
  layers have window = max_seq_len). Window W, whose layers take c_W bytes per
  token, gets the share `(c_W / sum c) * W / sum_v (c_v / sum c) * v` of the
  memory (float32, as `calculateWindowSizeToShare` computes it), i.e. tokens
  proportional to W: `tokens_W = int(memory * share_W / c_W)` and
  `ceil(tokens_W / tokens_per_block)` primary blocks, printed as
  `[windowSize=W] {.primaryBlocks=N, .secondayBlocks=0}`.
  Recurrent state (Mamba / Gated DeltaNet) lives in a separate cache of
  max_batch_size slots, taken from the budget first.
- V2 manager (`KVCacheManagerV2`) by its own defaults (manager "v2-default",
  what `--engine trtllm` shows; `allocate`'s default stays "v1" for its callers): granularity, grains, the fallback ratio and water-filling of
  `trtllm_v2` (core package `kv_cache_manager_v2`). Manager "v2-typical": V2 given
  `avg_seq_len` (the limits'), sized from the executor's typical step and constraints.
  Manager "v2": V2 given kvpool's
  plan as `pool_ratio` (what `--emit trtllm` configures): kvpool's own plan.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from kvpool.engines import trtllm_v2, trtllm_v2_executor
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
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.report import plan_warnings
from kvpool.spec import Kind, LayerGroup, ModelSpec

VERSION = "TensorRT-LLM main branch at commit b35ac1b6 (2026), PyTorch backend"
SOURCES = (
    "cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp: BlockManager::calculateWindowSizeToShare, "
    "BaseKVCacheManager::calculateMaxNumBlocks ('Blocks per window size')",
    "tensorrt_llm/_torch/pyexecutor/resource_manager.py: KVCacheManager (V1) and KVCacheManagerV2",
    "tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py: recurrent state slots per max_batch_size",
)
MANAGERS = ("v2-default", "v2-typical", "v2", "v1")
RELEASES = ("v2", "v1")  # `--engine trtllm` is V2 by its defaults, `trtllm@v1` the old manager
# the attention kinds V1 and V2 are modelled for (any other is refused by name: engines.common.refuse_kinds)
KINDS = frozenset({"full", "sliding", "chunked", "state"})


def allocate(spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int, *, manager: str = "v1") -> EngineReport:
    """What TensorRT-LLM would allocate from `kv_memory_bytes` (its KV budget:
    free memory x free_gpu_memory_fraction, or max_gpu_total_bytes) at
    tokens_per_block = the spec's (kvpool's default 32 is TensorRT-LLM's too). Refusals are reported."""
    if kv_memory_bytes < 1:
        raise LimitsError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}")
    if manager not in MANAGERS:
        raise EngineNotModelledError(f"TensorRT-LLM manager {manager!r}; use one of {', '.join(MANAGERS)}")
    refuse_kinds(spec, KINDS, "TensorRT-LLM")
    if manager == "v2":
        return _from_plan(plan_pools(spec, limits, kv_memory_bytes=kv_memory_bytes))
    if manager == "v2-default":
        return _v2_default(spec, limits, kv_memory_bytes)
    if manager == "v2-typical":
        if limits.avg_seq_len is None:
            raise LimitsError("TensorRT-LLM V2's typical step needs avg_seq_len")
        options = trtllm_v2_executor.options_for(limits, avg_seq_len=limits.avg_seq_len)
        return _v2_default(spec, limits, kv_memory_bytes, options)
    return allocate_with(V1Model(), spec, limits, kv_memory_bytes)


@dataclass(frozen=True)
class Window:
    """One V1 pool: the layer groups of attention window `size` (full layers:
    max_seq_len), their bytes per token, and the primary blocks its share buys."""

    size: int
    groups: tuple[str, ...]
    per_token: int
    kind: Kind
    window: int | None
    blocks: int = 0


@dataclass(frozen=True)
class V1Sizing(Sizing):
    """V1's sizing: the windows' blocks and the recurrent state's groups."""

    windows: tuple[Window, ...] = ()
    states: tuple[LayerGroup, ...] = ()


@dataclass(frozen=True)
class V1Model:
    """TensorRT-LLM's C++ KV cache manager (V1), as an `EngineModel`."""

    engine: str = "trtllm"
    release: str = "v1"
    sources: tuple[str, ...] = SOURCES

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> V1Sizing:
        """The recurrent state first (max_batch_size slots), then each window's
        share of the rest (`calculateWindowSizeToShare`, in float32)."""
        refuse_kinds(spec, KINDS, "TensorRT-LLM")
        tpb = spec.tokens_per_block
        notes = [
            f"{spec.name}: max_seq_len {limits.max_seq_len}, tokens_per_block {tpb}, "
            f"max_batch_size {limits.max_batch_size}"
        ]
        states = tuple(g for g in spec.groups if g.kind == "state")
        memory = kv_memory_bytes - sum(g.state_bytes for g in states) * limits.max_batch_size
        if memory <= 0:
            refusal = f"the recurrent state of {limits.max_batch_size} requests leaves no memory for the KV cache"
            return V1Sizing(spec, limits, kv_memory_bytes, (refusal,), notes=tuple(notes))
        windows = by_window(spec, limits, notes)
        total_c = np.float32(sum(w.per_token for w in windows))
        contribution = [np.float32(np.float32(w.per_token) / total_c) * np.float32(w.size) for w in windows]
        denominator = np.float32(sum(float(c) for c in contribution))
        sized = []
        for w, c in zip(windows, contribution, strict=True):
            share = np.float32(1.0) if len(windows) == 1 else np.float32(c / denominator)
            tokens = int(float(np.float32(np.float32(memory) * share)) / w.per_token)
            sized.append(replace(w, blocks=-(-tokens // tpb)))
        if states:
            notes.append(f"recurrent state: {limits.max_batch_size} slots taken from the budget before the KV pools")
        return V1Sizing(spec, limits, kv_memory_bytes, notes=tuple(notes), windows=tuple(sized), states=states)

    def pools(self, sizing: V1Sizing) -> tuple[EnginePool, ...]:
        """One pool per window, then the recurrent state's slots."""
        if sizing.refusals:
            return ()
        tpb = sizing.spec.tokens_per_block
        pools = [
            EnginePool(
                f"window_{w.size}",
                tpb,
                w.per_token * tpb,
                w.blocks,
                w.groups,
                (member(f"window_{w.size}", w.kind, tpb, window=w.window),),
                w.blocks * tpb,
            )
            for w in sizing.windows
        ]
        if sizing.states:
            pools.append(
                EnginePool(
                    "mamba",
                    0,
                    sum(g.state_bytes for g in sizing.states),
                    sizing.limits.max_batch_size,
                    tuple(g.name for g in sizing.states),
                    (member("mamba", "state", 1),),
                )
            )
        return tuple(pools)

    def report(self, sizing: V1Sizing, pools: tuple[EnginePool, ...]) -> EngineReport:
        """The 'Blocks per window size' lines and kvpool's plan of the same pages."""
        base = EngineReport(
            self.engine, VERSION + ", KV cache manager V1", self.sources, sizing.limits, sizing.budget_bytes, ()
        )
        if sizing.refusals:
            return replace(base, refusals=sizing.refusals, notes=sizing.notes)
        spec, limits = sizing.spec, sizing.limits
        notes = list(sizing.notes)
        if sum(p.bytes for p in pools) > sizing.budget_bytes:
            notes.append("blocks are rounded up per window, so the pools may exceed the budget by one block each")
        group_pages = {name: w.blocks for w in sizing.windows for name in w.groups}
        group_pages.update({g.name: limits.max_batch_size for g in sizing.states})
        plan = PoolPlan.from_pages(spec, group_pages, limits, policy="trtllm-v1")
        reported = {
            "blocks_per_window": {str(w.size): w.blocks for w in sizing.windows},
            "tokens_per_block": spec.tokens_per_block,
        }
        lines = tuple(f"[windowSize={w.size}] {{.primaryBlocks={w.blocks}, .secondayBlocks=0}}" for w in sizing.windows)
        return replace(
            base,
            pools=pools,
            reported=reported,
            lines=lines,
            degradations=plan_warnings(plan),
            notes=tuple(notes),
            group_pages=group_pages,
        )


def by_window(spec: ModelSpec, limits: ServingLimits, notes: list[str]) -> list[Window]:
    """The paged groups by attention window, smallest first (full layers and
    windows past max_seq_len: max_seq_len; chunked attention as a window of its
    chunk, noted in `notes`)."""
    windows: dict[int, list[str]] = defaultdict(list)
    per_token: dict[int, int] = defaultdict(int)
    kinds: dict[int, tuple[Kind, int | None]] = {}
    for g in spec.groups:
        if g.kind == "state":
            continue
        w = limits.max_seq_len if g.kind == "full" else min(g.window or limits.max_seq_len, limits.max_seq_len)
        if g.kind == "chunked":
            notes.append(f"group {g.name}: chunked attention sized as an attention window of {g.window}")
        windows[w].append(g.name)
        per_token[w] += g.row_bytes
        kinds[w] = ("full", None) if w == limits.max_seq_len else (g.kind, g.window)
    return [Window(w, tuple(windows[w]), per_token[w], *kinds[w]) for w in sorted(windows)]


def _from_plan(plan: PoolPlan) -> EngineReport:
    """The V2 manager's pools: kvpool's plan, one pool per group."""
    tpb = plan.spec.tokens_per_block
    pools = tuple(
        EnginePool(
            g.name,
            0 if g.kind == "state" else tpb,
            g.page_bytes,
            g.pages,
            (g.name,),
            (plan.spec.group(g.name),),
            None if g.kind == "state" else g.pages * tpb,
        )
        for g in plan.groups
    )
    lines = tuple(f"[{g.name}] {g.pages} blocks of {g.page_bytes} bytes" for g in plan.groups)
    return EngineReport(
        "trtllm",
        VERSION + ", KV cache manager V2",
        SOURCES,
        plan.limits,
        plan.budget_bytes,
        pools,
        {"blocks_per_pool": {g.name: g.pages for g in plan.groups}, "tokens_per_block": tpb, "policy": plan.policy},
        lines,
        (),
        plan.warnings,
        plan.notes,
        {g.name: g.pages for g in plan.groups},
    )


def _v2_default(
    spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int, options: trtllm_v2.V2Options = trtllm_v2.DEFAULTS
) -> EngineReport:
    """V2 sized by its allocator fallback (or by `options`), run through the EngineModel protocol."""
    refuse_kinds(spec, KINDS, "TensorRT-LLM V2")
    return allocate_with(trtllm_v2.V2Model(VERSION, SOURCES, options=options), spec, limits, kv_memory_bytes)
