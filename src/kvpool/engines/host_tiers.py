"""The host tier of one rank, by whose rule sizes it (plan/tiers.py then splits
it over the groups in the GPU plan's proportions):

- `even`: the node's host memory for KV split evenly over its ranks.
- TensorRT-LLM V2 (`host_cache_size` unset): auto-provisioned per rank as
  `min(GPU quota, host memory / local ranks x 0.5, RLIMIT_MEMLOCK x 0.8)`
  (KVCacheManagerV2's executor wrapper; ../shared/research/trtllm-kvcm-v2.md).
- vLLM `--kv-offloading-size`: GiB for the whole server, "summed across all TP
  ranks" (vllm/config/cache.py, `kv_offloading_size`); with the LMCache backend
  vLLM divides it by the KV ranks (TP x PP) into LMCache's per-rank
  `max_local_cpu_size`.
- SGLang HiCache: per rank, `--hicache-size` GB when given, else
  `--hicache-ratio` (2.0 in its examples) times the device pool
  (`HostKVCache(host_to_device_ratio, host_size)`); a hybrid model's Mamba host
  pool comes on top (engines/hicache.py).
"""

from __future__ import annotations

from kvpool.errors import LimitsError
from kvpool.plan.tiers import GB, GiB

HOST_RULES = ("even", "trtllm", "vllm", "sglang")
# the rules that size the host tier from the node's host memory (SGLang's ratio needs none)
NEEDS_HOST_MEMORY = frozenset({"even", "trtllm", "vllm"})


def host_tier_bytes(
    rule: str,
    *,
    gpu_kv_bytes: int,
    host_memory: int | None = None,
    ranks_per_node: int = 1,
    kv_ranks: int = 1,
    memlock: int | None = None,
    offloading_gib: float | None = None,
    hicache_ratio: float = 2.0,
    hicache_gb: float | None = None,
) -> tuple[int, str]:
    """The host tier of one rank under `rule`, in bytes, and the rule in words.

    `even`: `host_memory` (bytes for KV on one node) split evenly over the
    node's ranks. `trtllm`: V2's auto-provisioning from the node's free
    `host_memory` and `memlock` (RLIMIT_MEMLOCK; None: unlimited). `vllm`:
    `--kv-offloading-size` (`offloading_gib`, the whole server) over
    `kv_ranks`. `sglang`: `--hicache-size` (`hicache_gb`) or `--hicache-ratio`
    times `gpu_kv_bytes`. Raises `LimitsError` for what a rule needs and lacks."""
    if ranks_per_node < 1 or kv_ranks < 1:
        raise LimitsError(f"ranks must be >= 1, got ranks per node {ranks_per_node}, KV ranks {kv_ranks}")
    if rule == "even":
        return _even(host_memory, ranks_per_node)
    if rule == "trtllm":
        return _trtllm(gpu_kv_bytes, host_memory, ranks_per_node, memlock)
    if rule == "vllm":
        return _vllm(offloading_gib, kv_ranks)
    if rule == "sglang":
        return _sglang(gpu_kv_bytes, hicache_ratio, hicache_gb)
    raise LimitsError(f"unknown host tier rule {rule!r}; one of even, trtllm, vllm, sglang")


def _even(host_memory: int | None, ranks_per_node: int) -> tuple[int, str]:
    if host_memory is None:
        raise LimitsError("the host tier needs --host-memory")
    return host_memory // ranks_per_node, f"host memory / {ranks_per_node} ranks per node"


def _trtllm(gpu_kv_bytes: int, host_memory: int | None, ranks_per_node: int, memlock: int | None) -> tuple[int, str]:
    if host_memory is None:
        raise LimitsError("TensorRT-LLM's host tier auto-provisioning needs the node's free host memory")
    parts = [gpu_kv_bytes, int(host_memory / ranks_per_node * 0.5)]
    if memlock is not None:
        parts.append(int(memlock * 0.8))
    return min(parts), "TensorRT-LLM V2: min(GPU quota, host memory / local ranks x 0.5, RLIMIT_MEMLOCK x 0.8)"


def _vllm(offloading_gib: float | None, kv_ranks: int) -> tuple[int, str]:
    if offloading_gib is None or offloading_gib <= 0:
        raise LimitsError("vLLM's CPU offload needs --kv-offloading-size (GiB, summed over TP ranks)")
    return int(
        offloading_gib * GiB
    ) // kv_ranks, f"vLLM --kv-offloading-size {offloading_gib:g} GiB / {kv_ranks} KV ranks"


def _sglang(gpu_kv_bytes: int, hicache_ratio: float, hicache_gb: float | None) -> tuple[int, str]:
    if hicache_gb is not None:
        return int(hicache_gb * GB), f"SGLang --hicache-size {hicache_gb:g} GB per rank"
    if hicache_ratio <= 0:
        raise LimitsError(f"--hicache-ratio must be positive, got {hicache_ratio}")
    return int(gpu_kv_bytes * hicache_ratio), f"SGLang --hicache-ratio {hicache_ratio:g} x the device pool"
