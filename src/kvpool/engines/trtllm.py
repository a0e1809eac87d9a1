"""TensorRT-LLM (PyTorch backend): one block pool per attention window.

Rules modelled (facts read from TensorRT-LLM's source; no TensorRT-LLM code is used):

- V1 manager (C++ `KVCacheManager`): layers are grouped by attention window (full
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
from dataclasses import replace

import numpy as np

from kvpool.engines import trtllm_v2
from kvpool.engines.common import (
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    allocate_with,
    member,
    refuse_compressed,
)
from kvpool.errors import LimitsError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.report import plan_warnings
from kvpool.spec import Kind, ModelSpec

VERSION = "TensorRT-LLM main branch at commit b35ac1b6 (2026), PyTorch backend"
SOURCES = (
    "cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp: BlockManager::calculateWindowSizeToShare, "
    "BaseKVCacheManager::calculateMaxNumBlocks ('Blocks per window size')",
    "tensorrt_llm/_torch/pyexecutor/resource_manager.py: KVCacheManager (V1) and KVCacheManagerV2",
    "tensorrt_llm/_torch/pyexecutor/mamba_cache_manager.py: recurrent state slots per max_batch_size",
)
MANAGERS = ("v2-default", "v2-typical", "v2", "v1")
RELEASES = ("v2", "v1")  # `--engine trtllm` is V2 by its defaults, `trtllm@v1` the old manager


def allocate(spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int, *, manager: str = "v1") -> EngineReport:
    """What TensorRT-LLM would allocate from `kv_memory_bytes` (its KV budget:
    free memory x free_gpu_memory_fraction, or max_gpu_total_bytes) at
    tokens_per_block = the spec's (kvpool's default 32 is TensorRT-LLM's too). Refusals are reported."""
    if kv_memory_bytes < 1:
        raise LimitsError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}")
    if manager not in MANAGERS:
        raise EngineNotModelledError(f"TensorRT-LLM manager {manager!r}; use one of {', '.join(MANAGERS)}")
    tpb = spec.tokens_per_block
    if manager == "v2":
        return _from_plan(plan_pools(spec, limits, kv_memory_bytes=kv_memory_bytes))
    if manager == "v2-default":
        return _v2_default(spec, limits, kv_memory_bytes)
    if manager == "v2-typical":
        if limits.avg_seq_len is None:
            raise LimitsError("TensorRT-LLM V2's typical step needs avg_seq_len")
        options = trtllm_v2.options_for(limits, avg_seq_len=limits.avg_seq_len)
        return _v2_default(spec, limits, kv_memory_bytes, options)
    refuse_compressed(spec, "TensorRT-LLM")
    notes = [
        f"{spec.name}: max_seq_len {limits.max_seq_len}, tokens_per_block {tpb}, max_batch_size {limits.max_batch_size}"
    ]
    base = EngineReport("trtllm", VERSION + ", KV cache manager V1", SOURCES, limits, kv_memory_bytes, ())
    states = [g for g in spec.groups if g.kind == "state"]
    state_bytes = sum(g.state_bytes for g in states) * limits.max_batch_size
    memory = kv_memory_bytes - state_bytes
    if memory <= 0:
        return replace(
            base,
            refusals=(f"the recurrent state of {limits.max_batch_size} requests leaves no memory for the KV cache",),
            notes=tuple(notes),
        )
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
    order = sorted(windows)
    total_c = np.float32(sum(per_token.values()))
    contribution = {w: np.float32(np.float32(per_token[w]) / total_c) * np.float32(w) for w in order}
    denominator = np.float32(sum(float(contribution[w]) for w in order))
    pools, lines, group_pages = [], [], {}
    for w in order:
        share = np.float32(1.0) if len(order) == 1 else np.float32(contribution[w] / denominator)
        tokens = int(float(np.float32(np.float32(memory) * share)) / per_token[w])
        blocks = -(-tokens // tpb)
        kind, window = kinds[w]
        pools.append(
            EnginePool(
                f"window_{w}",
                tpb,
                per_token[w] * tpb,
                blocks,
                tuple(windows[w]),
                (member(f"window_{w}", kind, tpb, window=window),),
                blocks * tpb,
            )
        )
        lines.append(f"[windowSize={w}] {{.primaryBlocks={blocks}, .secondayBlocks=0}}")
        group_pages.update({name: blocks for name in windows[w]})
    if states:
        pools.append(
            EnginePool(
                "mamba",
                0,
                sum(g.state_bytes for g in states),
                limits.max_batch_size,
                tuple(g.name for g in states),
                (member("mamba", "state", 1),),
            )
        )
        group_pages.update({g.name: limits.max_batch_size for g in states})
        notes.append(f"recurrent state: {limits.max_batch_size} slots taken from the budget before the KV pools")
    if sum(p.bytes for p in pools) > kv_memory_bytes:
        notes.append("blocks are rounded up per window, so the pools may exceed the budget by one block each")
    plan = PoolPlan.from_pages(spec, group_pages, limits, policy="trtllm-v1")
    reported = {"blocks_per_window": {str(w): group_pages[windows[w][0]] for w in order}, "tokens_per_block": tpb}
    return replace(
        base,
        pools=tuple(pools),
        reported=reported,
        lines=tuple(lines),
        degradations=plan_warnings(plan),
        notes=tuple(notes),
        group_pages=group_pages,
    )


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
    refuse_compressed(spec, "TensorRT-LLM V2")
    return allocate_with(trtllm_v2.V2Model(VERSION, SOURCES, options=options), spec, limits, kv_memory_bytes)
