"""The cold tiers below a plan's GPU pools, per rank, from what a deployment gives:
the node's host memory for KV, a disk quota per rank, and whose rule turns the
node's host memory into one rank's tier (`engines/host_tiers.py` holds the rules,
`plan/tiers.py` the split over the groups)."""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.cache.pool import check_pages
from kvpool.engines.host_tiers import HOST_RULES, NEEDS_HOST_MEMORY, host_tier_bytes
from kvpool.errors import KvpoolError, flagged
from kvpool.plan import PoolPlan
from kvpool.plan.tiers import GiB, TierPlan, plan_tiers
from kvpool.units import format_bytes, parse_size

RULES = HOST_RULES


def _size(name: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except KvpoolError as e:
        raise KvpoolError(f"{name}: {e}") from None


@dataclass(frozen=True)
class TierOptions:
    """`host_memory`: host memory for KV on one node; `disk`: a disk tier per rank
    (sizes as given, bytes or text); `host_rule`: how one rank's host tier follows
    from the node's (`RULES`); `ranks_per_node`: the GPUs sharing the node's host
    memory (default: tp x pp, one engine). With more ranks than one engine's on the
    node, each engine's vLLM `--kv-offloading-size` is its share of the node's memory."""

    host_memory: str | None = None
    disk: str | None = None
    host_rule: str = "even"
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.host_rule not in RULES:
            raise KvpoolError(f"--host-rule {self.host_rule!r}: choose one of {', '.join(RULES)}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise KvpoolError(f"--ranks-per-node must be at least 1, got {self.ranks_per_node}")

    @property
    def asked(self) -> bool:
        """Whether any tier is asked for (a rule other than `even` asks for one)."""
        return self.host_memory is not None or self.disk is not None or self.host_rule != "even"

    def check(self) -> None:
        """Refuse the options that mean nothing without `host_memory` (a rule other
        than sglang's sizes the host tier from it; ranks share it), not ignore them."""
        if self.host_memory is not None:
            return
        if self.host_rule in NEEDS_HOST_MEMORY - {"even"}:
            raise KvpoolError(f"--host-rule {self.host_rule} sizes the host tier from --host-memory; give it")
        if self.ranks_per_node is not None:
            raise KvpoolError("--ranks-per-node says how many ranks share --host-memory; give it")

    def per_rank(self, plan: PoolPlan, tp: int, pp: int) -> list[TierPlan]:
        """The cold tiers of one rank of tp x pp below `plan` (none without
        options); KvpoolError naming the option for a bad size or a rule that lacks
        its input."""
        host, disk = _size("--host-memory", self.host_memory), _size("--disk", self.disk)
        if host is None and disk is None and self.host_rule in NEEDS_HOST_MEMORY:
            return []
        ranks = self.ranks_per_node if self.ranks_per_node is not None else tp * pp
        host_bytes: int | None = None
        rule: str = self.host_rule
        if host is not None or self.host_rule not in NEEDS_HOST_MEMORY:
            host_bytes, rule = host_tier_bytes(
                self.host_rule,
                gpu_kv_bytes=sum(g.bytes for g in plan.groups),
                host_memory=host,
                ranks_per_node=ranks,
                kv_ranks=tp * pp,
                # vLLM's size is one server's, summed over its KV ranks: its share of the node
                offloading_gib=None if host is None else host / GiB * (tp * pp) / ranks,
                hicache_gb=None if host is None else host / ranks / 1e9,
            )
        return check_tier_pages(plan_tiers(plan, host_bytes, disk, rule))


def check_tier_pages(tiers: list[TierPlan]) -> list[TierPlan]:
    """`tiers`, refused by the option that sized them when one holds more pages
    than a manager keeps books for: here, not after a simulation ran out of memory."""
    for t in tiers:
        with flagged("--host-memory" if t.medium == "CPU" else "--disk"):
            for group, pages in t.pages.items():
                check_pages(pages, f"one rank's {t.medium} tier ({format_bytes(t.bytes)}) for group {group!r}")
    return tiers
