"""`--host-memory`, `--disk` and `--host-rule`: the cold tiers below a plan's
GPU pools, per rank, as each engine would size its host tier (`plan/tiers.py`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from kvpool.cache.pool import check_pages
from kvpool.cli.common import flagged, positive_int, size_arg, table
from kvpool.engines.host_tiers import HOST_RULES, NEEDS_HOST_MEMORY, host_tier_bytes
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.plan.tiers import GiB, TierPlan, plan_tiers
from kvpool.units import format_bytes, parse_size

RULES = HOST_RULES


def add_tier_args(
    p: argparse.ArgumentParser,
    *,
    title: str = "cold tiers per rank (host memory, disk; docs/cache.md)",
    host_memory: Callable[[str], object] = size_arg,
    host_memory_note: str = "",
) -> Any:
    """--host-memory, --disk, --host-rule, --ranks-per-node in a group titled
    `title` (returned, for callers that add more). `host_memory` parses
    --host-memory (simulate takes a list of sizes); `host_memory_note` ends its help."""
    t = p.add_argument_group(title)
    t.add_argument(
        "--host-memory",
        type=host_memory,
        metavar="SIZE" if host_memory is size_arg else "SIZE[,SIZE...]",
        help="host memory for KV on one node, e.g. 256GiB; one rank's host tier follows --host-rule" + host_memory_note,
    )
    t.add_argument("--disk", type=size_arg, metavar="SIZE", help="disk tier per rank, e.g. 1TiB")
    t.add_argument(
        "--host-rule",
        choices=RULES,
        default="even",
        help="how one rank's host tier follows from --host-memory: even (split over the node's ranks), "
        "trtllm (V2's auto-provisioning: min(GPU KV, host / ranks x 0.5)), vllm (--kv-offloading-size = "
        "host memory, over the KV ranks), sglang (--hicache-size = host / ranks; without --host-memory "
        "--hicache-ratio 2 x the device pool)",
    )
    t.add_argument(
        "--ranks-per-node",
        type=positive_int,
        default=None,
        metavar="N",
        help="GPUs (ranks) on one node sharing --host-memory (default: tp x pp)",
    )
    return t


def check_dependent(args: argparse.Namespace) -> None:
    """Refuse the tier flags that mean nothing without --host-memory (a rule other
    than sglang's sizes the host tier from it; ranks share it), not ignore them."""
    if args.host_memory is not None:
        return
    if args.host_rule in NEEDS_HOST_MEMORY - {"even"}:
        raise KvpoolError(f"--host-rule {args.host_rule} sizes the host tier from --host-memory; give it")
    if args.ranks_per_node is not None:
        raise KvpoolError("--ranks-per-node says how many ranks share --host-memory; give it")


def tiers_from_args(args: argparse.Namespace, plan: PoolPlan) -> list[TierPlan]:
    """The cold tiers of one rank the options ask for (none without them);
    `KvpoolError` naming the flag for a bad size or a rule that lacks its input."""
    host, disk = (_size(args, name) for name in ("host_memory", "disk"))
    if host is None and disk is None and args.host_rule in NEEDS_HOST_MEMORY:
        return []
    ranks = args.ranks_per_node if args.ranks_per_node is not None else args.tp * args.pp
    if ranks < 1:
        raise KvpoolError(f"--ranks-per-node must be at least 1, got {ranks}")
    gpu_kv = sum(g.bytes for g in plan.groups)
    host_bytes, rule = None, args.host_rule
    if host is not None or args.host_rule not in NEEDS_HOST_MEMORY:
        host_bytes, rule = host_tier_bytes(
            args.host_rule,
            gpu_kv_bytes=gpu_kv,
            host_memory=host,
            ranks_per_node=ranks,
            kv_ranks=args.tp * args.pp,
            offloading_gib=None if host is None else host / GiB,
            hicache_gb=None if host is None else host / ranks / 1e9,
        )
    tiers = plan_tiers(plan, host_bytes, disk, rule)
    for t in tiers:  # a tier no machine's books hold is refused here, not after a simulation ran out of memory
        with flagged("--host-memory" if t.medium == "CPU" else "--disk"):
            for group, pages in t.pages.items():
                check_pages(pages, f"one rank's {t.medium} tier ({format_bytes(t.bytes)}) for group {group!r}")
    return tiers


def _size(args: argparse.Namespace, name: str) -> int | None:
    text = getattr(args, name)
    if text is None:
        return None
    flag = "--" + name.replace("_", "-")
    try:
        return parse_size(text)
    except KvpoolError as e:
        raise KvpoolError(f"{flag}: {e}") from None


def render(tiers: list[TierPlan]) -> str:
    """The cold tiers as a table: medium, bytes per rank, pages per group, the rule."""
    groups = list(tiers[0].pages)
    rows = [[t.medium, format_bytes(t.bytes), *(f"{t.pages[g]:,}" for g in groups), t.rule] for t in tiers]
    return "cold tiers per rank:\n" + table(["tier", "bytes", *(f"{g} pages" for g in groups), "size from"], rows)
