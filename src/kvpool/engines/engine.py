"""`Engine`: what the registry knows of one engine (its names, kinds, rules and
functions), and the options a caller may pass to one; `entries.py` holds one
per engine, `registry.py` looks them up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpool.engines import budgets, emit
    from kvpool.engines.common import EngineReport
    from kvpool.models.weights import Parallel
    from kvpool.plan import PoolPlan, ServingLimits
    from kvpool.plan.memory import MemoryBudget
    from kvpool.spec import ModelSpec


@dataclass(frozen=True)
class EngineOptions:
    """The engine-specific options a caller may pass along (`--block-size` and
    `--no-async-scheduling` are vLLM's); an engine that takes none refuses them."""

    block_size: int | None = None
    async_scheduling: bool = True


@dataclass(frozen=True)
class Engine:
    """One engine: `name` the CLI takes, `title` as it prints, `releases` modelled
    (newest, the default of a bare name, first), `kinds` of attention its models
    size (any other is refused by name), `options` it takes (EngineOptions field
    names), its `admission` rule in the simulator (sched/admission.py) and whether
    the simulator runs its pools as one shared pool, how its decode CUDA graphs
    are used (`graph_rule`), and the functions for its report, launch and budgets."""

    name: str
    title: str
    releases: tuple[str, ...]
    kinds: frozenset[str]
    options: tuple[str, ...]
    admission: str
    shared_pool: bool
    graph_rule: str
    report: Callable[[PoolPlan, str, EngineOptions], EngineReport]
    emit: Callable[[PoolPlan, str, Parallel | None], emit.Emitted]
    budget_flags: Callable[[int, MemoryBudget | None], tuple[str, ...]]
    default_kv: Callable[[MemoryBudget, int, int, int | None], budgets.DefaultKV]
    split: Callable[[ModelSpec, ServingLimits, int], EngineReport]

    def spec_name(self, release: str | None = None) -> str:
        """`name@release` (the newest when None)."""
        return f"{self.name}@{release or self.releases[0]}"
