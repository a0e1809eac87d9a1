"""Cold tiers in `kvpool simulate`: `--host-memory` (one size, or a list that
sweeps the host tier's size), `--disk`, `--host-rule`, `--preemption`, the
link's bandwidths; each run's tiers come from `cli/tiers_args.py`'s rules, and
a sweep prints what each size buys (`sim/transfers.py`, `Scheduler(preemption="suspend")`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvpool.cache import TierSpec
from kvpool.cli.common import size_or_zero, table
from kvpool.cli.tiers_args import tiers_from_args
from kvpool.engines.host_tiers import NEEDS_HOST_MEMORY
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.presets import GpuSpec
from kvpool.sim import SimResult
from kvpool.sim.transfers import Link
from kvpool.units import format_bytes


@dataclass(frozen=True)
class TierRuns:
    """What the tier options ask for: the host sizes (None: no --host-memory),
    the link the copies use, and the preemption mode."""

    sizes: tuple[str | None, ...]
    link: Link
    preemption: str

    @property
    def sweep(self) -> bool:
        return len(self.sizes) > 1

    def specs(self, args: argparse.Namespace, plan: PoolPlan, size: str | None) -> list[TierSpec]:
        """One rank's cold tiers for host size `size` under --host-rule, and
        --disk's. A 0 size is no host tier (pages go straight to disk, if any);
        with no tier at all, a host tier of 0 bytes, which changes nothing, so
        that the run reports its tier counts beside the others."""
        if plan.shared:
            raise KvpoolError(
                "--host-memory / --disk: cold tiers with a shared pool (an engine:vllm plan, one pool for "
                "every group) are not supported; simulate another policy"
            )
        zero = size is not None and size_or_zero(size) == 0
        sub = argparse.Namespace(**{**vars(args), "host_memory": None if zero else size})
        tiers = [TierSpec(t.medium, t.bytes) for t in tiers_from_args(sub, plan)]
        if not tiers:
            tiers.append(TierSpec("CPU", 0))
        return tiers


def tier_runs(args: argparse.Namespace, gpu: GpuSpec) -> TierRuns | None:
    """The tier options, checked before any run (None: no tiers asked for)."""
    asked = args.host_memory is not None or args.disk is not None or args.host_rule != "even"
    if not asked:
        if args.preemption == "suspend":
            raise KvpoolError("--preemption suspend parks pages in a cold tier: add --host-memory (or --disk)")
        for flag, value in (
            ("--host-bandwidth", args.host_bandwidth),
            ("--disk-bandwidth", args.disk_bandwidth),
            ("--transfer-overlap", args.transfer_overlap or None),
            ("--ranks-per-node", args.ranks_per_node),
        ):
            if value is not None:  # it would mean nothing: say so rather than ignore it
                raise KvpoolError(f"{flag} applies to cold tiers: add --host-memory (or --disk)")
        return None
    if args.host_memory is None and args.host_rule in NEEDS_HOST_MEMORY - {"even"}:
        raise KvpoolError(f"--host-rule {args.host_rule} sizes the host tier from --host-memory: add it")
    sizes: tuple[str | None, ...] = (None,)
    if args.host_memory is not None:  # checked by the parser (`simulate_args.host_sizes`)
        sizes = tuple(part.strip() for part in args.host_memory.split(","))
    gb = 1e9
    link = Link.of(
        gpu,
        host_bytes_per_s=None if args.host_bandwidth is None else args.host_bandwidth * gb,
        disk_bytes_per_s=None if args.disk_bandwidth is None else args.disk_bandwidth * gb,
        overlap=args.transfer_overlap,
    )
    return TierRuns(sizes, link, args.preemption)


def host_label(size: str | None) -> str:
    return "-" if size is None else size


def sweep_table(rows: list[tuple[str | None, SimResult]]) -> str:
    """Per host size: one rank's host tier, the prompt hit rate, TTFT, throughput
    and what the tiers moved."""
    out = []
    for size, r in rows:
        t = r.tiers or {}
        ttft50, ttft99 = r.percentile(r.ttft_s, 50), r.percentile(r.ttft_s, 99)
        out.append(
            [
                host_label(size),
                format_bytes(t.get("bytes", {}).get("CPU", 0)),
                f"{r.prompt_hit_rate:.1%}",
                "-" if ttft50 is None else f"{ttft50:,.2f}",
                "-" if ttft99 is None else f"{ttft99:,.2f}",
                f"{r.output_tokens_per_s:,.0f}",
                f"{t.get('pages_onboarded', 0):,}",
                f"{t.get('pages_offloaded', 0):,}",
                f"{r.preemptions:,}",
                f"{t.get('suspensions', 0):,}",
                f"{t.get('transfer_s', 0.0):,.2f}",
            ]
        )
    headers = [
        "host memory",
        "host tier/rank",
        "prompt hits",
        "TTFT p50 s",
        "TTFT p99 s",
        "tok/s",
        "pages onboarded",
        "pages offloaded",
        "preempt",
        "suspended",
        "copy s",
    ]
    return table(headers, out)
