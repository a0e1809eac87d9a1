"""`--host-memory`, `--disk` and `--host-rule`: the options of the cold tiers below
a plan's GPU pools, per rank (`kvpool.deploy.tiers` sizes them), and their table."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from kvpool.cli.common import positive_int, size_arg, table
from kvpool.deploy.tiers import RULES
from kvpool.plan.tiers import TierPlan
from kvpool.units import format_bytes


def add_tier_args(
    p: argparse.ArgumentParser,
    *,
    title: str = "cold tiers per rank (host memory, disk; docs/cache.md)",
    host_memory: Callable[[str], object] = size_arg,
    host_memory_note: str = "",
    engine_rules: bool = False,
) -> Any:
    """--host-memory, --disk, --host-rule, --ranks-per-node in a group titled
    `title` (returned, for callers that add more). `host_memory` parses
    --host-memory (simulate takes a list of sizes); `host_memory_note` ends its help.
    `engine_rules`: --host-rule defaults to each engine's own rule (fit)."""
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
        default=None if engine_rules else "even",
        help="how one rank's host tier follows from --host-memory: "
        + ("each engine's own (default), or " if engine_rules else "")
        + "even (split over the node's ranks"
        + ("" if engine_rules else "; default")
        + "), "
        "trtllm (V2's auto-provisioning: min(GPU KV, host / ranks x 0.5)), vllm (--kv-offloading-size = "
        "host memory, over the KV ranks), sglang (--hicache-size = host / ranks; without --host-memory "
        "--hicache-ratio 2 x the device pool)",
    )
    t.add_argument(
        "--ranks-per-node",
        type=positive_int,
        default=None,
        metavar="N",
        help="GPUs (ranks) on one node sharing --host-memory (default: "
        + ("the GPUs of --gpu, at most 8)" if engine_rules else "tp x pp)"),
    )
    return t


def render(tiers: list[TierPlan]) -> str:
    """The cold tiers as a table: medium, bytes per rank, pages per group, the rule."""
    groups = list(tiers[0].pages)
    rows = [[t.medium, format_bytes(t.bytes), *(f"{t.pages[g]:,}" for g in groups), t.rule] for t in tiers]
    return "cold tiers per rank:\n" + table(["tier", "bytes", *(f"{g} pages" for g in groups), "size from"], rows)
