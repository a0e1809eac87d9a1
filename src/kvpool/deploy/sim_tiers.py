"""Cold tiers in a simulation: `host_memory` (one size, or a list that sweeps the
host tier's size), `disk`, `host_rule`, `preemption` and the link's bandwidths;
each run's tiers follow the rules of `tiers.py` (`sim/transfers.py` prices the
copies, `Scheduler(preemption="suspend")` parks preempted requests)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.cache import TierSpec
from kvpool.deploy.options import flag
from kvpool.deploy.tiers import TierOptions
from kvpool.engines.host_tiers import NEEDS_HOST_MEMORY
from kvpool.errors import KvpoolError
from kvpool.media import Medium
from kvpool.plan import PoolPlan
from kvpool.presets import GpuSpec
from kvpool.sim.transfers import Link
from kvpool.units import size_or_zero

# Each host size is a whole simulation of the trace.
MAX_HOST_SIZES = 50
GB = 1e9


def host_sizes(sizes: int | str | Sequence[int | str]) -> tuple[str, ...]:
    """One size or several (a comma list or a sequence; 0: no host tier), each
    read by `units.size_or_zero`, as given."""
    items = sizes.split(",") if isinstance(sizes, str) else [sizes] if isinstance(sizes, int) else list(sizes)
    if len(items) > MAX_HOST_SIZES:
        raise KvpoolError(f"--host-memory: {len(items)} sizes, at most {MAX_HOST_SIZES} (each is a whole run)")
    out = tuple(str(s).strip() for s in items)
    for size in out:
        size_or_zero(size)
    return out


@dataclass(frozen=True)
class TierRuns:
    """What the tier options ask for: the host sizes (None: no host_memory, one
    run), the rest of the tier options, the link the copies use, and the
    preemption mode."""

    sizes: tuple[str | None, ...]
    options: TierOptions
    link: Link
    preemption: str

    @property
    def sweep(self) -> bool:
        return len(self.sizes) > 1

    def specs(self, plan: PoolPlan, size: str | None, tp: int, pp: int) -> list[TierSpec]:
        """One rank's cold tiers for host size `size` under the host rule, and the
        disk's. A 0 size is no host tier (pages go straight to disk, if any); with
        no tier at all, a host tier of 0 bytes, which changes nothing, so that the
        run reports its tier counts beside the others."""
        if plan.shared:
            raise KvpoolError(
                "--host-memory / --disk: cold tiers with a shared pool (an engine:vllm plan, one pool for "
                "every group) are not supported; simulate another policy"
            )
        zero = size is not None and size_or_zero(size) == 0
        options = dataclasses.replace(self.options, host_memory=None if zero else size)
        tiers = [TierSpec(t.medium, t.bytes) for t in options.per_rank(plan, tp, pp)]
        if not tiers:
            tiers.append(TierSpec(Medium.CPU, 0))
        return tiers


def tier_runs(values: dict[str, Any], gpu: GpuSpec) -> TierRuns | None:
    """The tier keywords of `simulate`, checked before any run (None: no tiers asked for)."""
    host, disk = values.get("host_memory"), values.get("disk")
    options = TierOptions(
        None, None if disk is None else str(disk), values.get("host_rule", "even"), values.get("ranks_per_node")
    )
    preemption = values.get("preemption", "recompute")
    if preemption not in ("recompute", "suspend"):
        raise KvpoolError(f"--preemption {preemption!r}: choose recompute or suspend")
    if host is None and not options.asked:
        refuse_without_tiers(values, preemption)
        return None
    if host is None and options.host_rule in NEEDS_HOST_MEMORY - {"even"}:
        raise KvpoolError(f"--host-rule {options.host_rule} sizes the host tier from --host-memory: add it")
    sizes: tuple[str | None, ...] = (None,) if host is None else host_sizes(host)
    return TierRuns(sizes, options, link_of(values, gpu), preemption)


def refuse_without_tiers(values: dict[str, Any], preemption: str) -> None:
    """The options of how pages move mean nothing without a tier: say so rather than ignore them."""
    if preemption == "suspend":
        raise KvpoolError("--preemption suspend parks pages in a cold tier: add --host-memory (or --disk)")
    for name in ("host_bandwidth", "disk_bandwidth", "transfer_overlap", "ranks_per_node"):
        value = values.get(name)
        if value is not None and value is not False:
            raise KvpoolError(f"{flag(name)} applies to cold tiers: add --host-memory (or --disk)")


def link_of(values: dict[str, Any], gpu: GpuSpec) -> Link:
    """The link the copies use: the GPU's host link and the disk's default, or the
    bandwidths given (GB/s); copies overlap the step with `transfer_overlap`."""
    host, disk = values.get("host_bandwidth"), values.get("disk_bandwidth")
    return Link.of(
        gpu,
        host_bytes_per_s=None if host is None else host * GB,
        disk_bytes_per_s=None if disk is None else disk * GB,
        overlap=bool(values.get("transfer_overlap", False)),
    )
