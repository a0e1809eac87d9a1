"""Sizing the cold tiers (host memory, disk) below a plan's GPU pools, per rank.

A cold tier of B bytes holds, per group, pages in the proportions of the GPU
plan: `gpu_pages[g] * B // gpu_bytes` (TensorRT-LLM V2's cold tiers keep the
hot tier's slot proportions; docs/cache.md). How big B is depends
on whose rule sizes it: each engine states its host tier its own way
(engines/host_tiers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import LimitsError
from kvpool.media import Medium
from kvpool.plan.result import PoolPlan

GiB = 1 << 30
GB = 10**9


@dataclass(frozen=True)
class TierPlan:
    """One cold tier of one rank: `bytes`, `pages` per group, and how its size
    was chosen (`rule`, in words)."""

    medium: Medium
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


def plan_tiers(plan: PoolPlan, host_bytes: int | None, disk_bytes: int | None, rule: str) -> list[TierPlan]:
    """The cold tiers of one rank below `plan` (host, then disk), each with its
    pages per group; a tier of None or 0 bytes is left out."""
    out = []
    if host_bytes:
        out.append(TierPlan(Medium.CPU, host_bytes, tier_pages(plan, host_bytes), rule))
    if disk_bytes:
        out.append(TierPlan(Medium.DISK, disk_bytes, tier_pages(plan, disk_bytes), "disk quota per rank"))
    return out
