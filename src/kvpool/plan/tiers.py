"""Sizing the cold tiers (host memory, disk) below a plan's GPU pools, per rank.

A cold tier of B bytes holds, per group, pages in the proportions of the GPU
plan: `gpu_pages[g] * B // gpu_bytes` (TensorRT-LLM V2's cold tiers keep the
hot tier's slot proportions; docs/cache.md). How big B is depends on whose rule
sizes it; each engine states its host tier differently:

- TensorRT-LLM V2 (`host_cache_size` unset): auto-provisioned per rank as
  `min(GPU quota, host memory / local ranks x 0.5, RLIMIT_MEMLOCK x 0.8)`
  (KVCacheManagerV2's executor wrapper; ../shared/research/trtllm-kvcm-v2.md).
- vLLM `--kv-offloading-size`: GiB for the whole server, "summed across all TP
  ranks" (vllm/config/cache.py, `kv_offloading_size`); with the LMCache backend
  vLLM divides it by the KV ranks (TP x PP) into LMCache's per-rank
  `max_local_cpu_size`.
- SGLang HiCache: per rank, `--hicache-size` GB when given, else
  `--hicache-ratio` (2.0 in its examples) times the device pool
  (`HostKVCache(host_to_device_ratio, host_size)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvpool.errors import LimitsError
from kvpool.plan.result import PoolPlan

GiB = 1 << 30
GB = 10**9
Rule = Literal["even", "trtllm", "vllm", "sglang"]


@dataclass(frozen=True)
class TierPlan:
    """One cold tier of one rank: `bytes`, `pages` per group, and how its size
    was chosen (`rule`, in words)."""

    medium: Literal["CPU", "DISK"]
    bytes: int
    pages: dict[str, int]
    rule: str

    def to_json(self) -> dict[str, object]:
        return {"medium": self.medium, "bytes": self.bytes, "pages": dict(self.pages), "rule": self.rule}


def tier_pages(plan: PoolPlan, tier_bytes: int) -> dict[str, int]:
    """Pages per group of a cold tier of `tier_bytes`, in the proportions of the
    GPU plan (`gpu_pages[g] * tier_bytes // gpu_bytes`)."""
    if plan.shared:
        raise LimitsError("cold tiers with a shared pool are not supported")
    gpu_bytes = sum(g.bytes for g in plan.groups)
    return {g.name: g.pages * tier_bytes // gpu_bytes if gpu_bytes else 0 for g in plan.groups}


def host_tier_bytes(
    rule: Rule,
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
        if host_memory is None:
            raise LimitsError("the host tier needs --host-memory")
        return host_memory // ranks_per_node, f"host memory / {ranks_per_node} ranks per node"
    if rule == "trtllm":
        if host_memory is None:
            raise LimitsError("TensorRT-LLM's host tier auto-provisioning needs the node's free host memory")
        parts = [gpu_kv_bytes, int(host_memory / ranks_per_node * 0.5)]
        if memlock is not None:
            parts.append(int(memlock * 0.8))
        return min(parts), "TensorRT-LLM V2: min(GPU quota, host memory / local ranks x 0.5, RLIMIT_MEMLOCK x 0.8)"
    if rule == "vllm":
        if offloading_gib is None or offloading_gib <= 0:
            raise LimitsError("vLLM's CPU offload needs --kv-offloading-size (GiB, summed over TP ranks)")
        return int(
            offloading_gib * GiB
        ) // kv_ranks, f"vLLM --kv-offloading-size {offloading_gib:g} GiB / {kv_ranks} KV ranks"
    if rule == "sglang":
        if hicache_gb is not None:
            return int(hicache_gb * GB), f"SGLang --hicache-size {hicache_gb:g} GB per rank"
        if hicache_ratio <= 0:
            raise LimitsError(f"--hicache-ratio must be positive, got {hicache_ratio}")
        return int(gpu_kv_bytes * hicache_ratio), f"SGLang --hicache-ratio {hicache_ratio:g} x the device pool"
    raise LimitsError(f"unknown host tier rule {rule!r}; one of even, trtllm, vllm, sglang")


def plan_tiers(plan: PoolPlan, host_bytes: int | None, disk_bytes: int | None, rule: str) -> list[TierPlan]:
    """The cold tiers of one rank below `plan` (host, then disk), each with its
    pages per group; a tier of None or 0 bytes is left out."""
    out = []
    if host_bytes:
        out.append(TierPlan("CPU", host_bytes, tier_pages(plan, host_bytes), rule))
    if disk_bytes:
        out.append(TierPlan("DISK", disk_bytes, tier_pages(plan, disk_bytes), "disk quota per rank"))
    return out
