"""Each engine's budget, two ways, per rank on a GPU of G bytes holding weights W:

- **pinned**: the engine's own flags for the KV bytes K of a kvpool plan
  (`budget_flags`): vLLM `--kv-cache-memory-bytes K` (exact; kvpool's own
  `--gpu-memory-utilization` convention beside it), SGLang `--mem-fraction-static
  F` with F = (K + W) / G rounded up to 3 digits (its pools get `G x F - W`,
  model_runner's `profile_max_num_token`), TensorRT-LLM
  `kv_cache_config.max_gpu_total_bytes: K`;
- **by its own defaults** (`default_kv`): what each engine leaves for KV when
  launched with none of those flags:
  - vLLM: `G x gpu_memory_utilization - weights - activation peak - CUDA graphs`
    (`gpu_worker.determine_available_memory`; no reserve unless one is given), at its
    default utilization 0.92 (vllm/config/cache.py `CacheConfig.gpu_memory_utilization`,
    0.32.0 and 0.33.0 alike; the rest is kvpool's per-rank estimate of what vLLM's
    profiling run measures, plan/memory.py);
  - SGLang 0.5.23: `G x F - W`, F from its `_handle_gpu_memory_settings`
    (arg_groups/memory_hook.py): `reserved = 512 + max(chunked_prefill_size, 2048)
    x 1.5 + tp x pp / 8 x 1024 + 2 x decode cuda_graph max_bs` MB, at least
    10 GiB on a GPU above 60 GiB, `F = round((G - reserved) / G, 3)` (G in MB),
    with its GPU-memory defaults for chunked_prefill_size and max_bs
    (`default_sglang_settings`); checked against SGLang's own ServerArgs in
    tests/engines_truth/;
  - TensorRT-LLM: `kv_cache_config.free_gpu_memory_fraction` 0.9 of the memory
    free after the weights and the profiled activation peak (KvCacheCreator's
    final manager: `(total - peak) x fraction`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from kvpool.plan.memory import MemoryBudget

MB = 1 << 20
GIB = 1 << 30
VLLM_UTILIZATION = 0.92  # vllm/config/cache.py, 0.32.0 and 0.33.0
TRTLLM_FREE_FRACTION = 0.9  # tensorrt_llm/llmapi/llm_args.py KvCacheConfig.free_gpu_memory_fraction


class DefaultKV(NamedTuple):
    """KV bytes per rank an engine takes by its own defaults, and its rule in words."""

    kv_bytes: int
    rule: str


def sglang_fraction(kv_bytes: int, memory: MemoryBudget) -> float:
    """SGLang's --mem-fraction-static for K bytes of pools on this GPU (module docstring)."""
    return math.ceil(1000 * (kv_bytes + memory.weights_bytes) / memory.gpu_bytes) / 1000


def vllm_flags(kv_bytes: int, memory: MemoryBudget | None) -> tuple[str, ...]:
    """vLLM: the exact `--kv-cache-memory-bytes`, with kvpool's utilization beside it."""
    exact = f"--kv-cache-memory-bytes {kv_bytes}"
    return (f"--gpu-memory-utilization {memory.utilization:g}", exact) if memory else (exact,)


def sglang_flags(kv_bytes: int, memory: MemoryBudget | None) -> tuple[str, ...]:
    """SGLang: `--mem-fraction-static` (needs the whole-GPU breakdown)."""
    return (f"--mem-fraction-static {sglang_fraction(kv_bytes, memory):.3f}",) if memory else ()


def trtllm_flags(kv_bytes: int, memory: MemoryBudget | None) -> tuple[str, ...]:
    """TensorRT-LLM: `kv_cache_config.max_gpu_total_bytes`."""
    return (f"kv_cache_config.max_gpu_total_bytes: {kv_bytes}",)


def default_sglang_settings(gpu_mb: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max_bs) SGLang 0.5.23 picks by GPU memory in MB
    and tensor parallelism (`_handle_gpu_memory_settings`)."""
    if gpu_mb < 20 * 1024:
        return 2048, 8
    if gpu_mb < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mb < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mb < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def sglang_default_fraction(gpu_bytes: int, tp: int, pp: int = 1, max_running_requests: int | None = None) -> float:
    """SGLang 0.5.23's `mem_fraction_static` when none is given (module docstring): decode CUDA
    graphs on, prefill graphs off (their defaults), no DP attention or DeepEP."""
    gpu_mb = gpu_bytes / MB
    chunk, max_bs = default_sglang_settings(gpu_mb, tp)
    if max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)
    reserved = 512 + max(chunk, 2048) * 1.5 + tp * pp / 8 * 1024 + max_bs * 2
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3)


def vllm_default(memory: MemoryBudget, tp: int, pp: int, max_batch_size: int | None) -> DefaultKV:
    """vLLM by its defaults (module docstring)."""
    rest = memory.weights_bytes + memory.activation_bytes + memory.cuda_graph_bytes + memory.reserved_bytes
    rule = (
        f"--gpu-memory-utilization {VLLM_UTILIZATION:g} (its default) x GPU - weights - activations - graphs - reserve"
    )
    return DefaultKV(int(memory.gpu_bytes * VLLM_UTILIZATION) - rest, rule)


def sglang_default(memory: MemoryBudget, tp: int, pp: int, max_batch_size: int | None) -> DefaultKV:
    """SGLang by its defaults (module docstring)."""
    f = sglang_default_fraction(memory.gpu_bytes, tp, pp, max_batch_size)
    rule = f"--mem-fraction-static {f:.3f} (its rule for this GPU and TP) x GPU - weights"
    return DefaultKV(int(memory.gpu_bytes * f) - memory.weights_bytes, rule)


def trtllm_default(memory: MemoryBudget, tp: int, pp: int, max_batch_size: int | None) -> DefaultKV:
    """TensorRT-LLM by its defaults (module docstring)."""
    free = memory.gpu_bytes - memory.weights_bytes - memory.activation_bytes
    rule = f"free_gpu_memory_fraction {TRTLLM_FREE_FRACTION:g} (its default) x (GPU - weights - activations)"
    return DefaultKV(int(free * TRTLLM_FREE_FRACTION), rule)
