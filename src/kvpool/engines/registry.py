"""The one engine registry: engine name -> its model, the kinds it models, its
flags, its launch emitter, its budgets and its releases. The engines' modules
load on the first look-up of an entry (`entries.py`): the names of the engines
and of their simulator policies need none of them.

Nothing outside `kvpool.engines` branches on an engine's name: the CLI, the
simulator and the fit answer ask `entry(name)` (or iterate `ENTRIES`) for what
differs between engines. A new engine is one `Engine` in `entries.py`, its name
in `NAMES` and its module.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from kvpool.engines.common import EngineNotModelledError, EngineReport, refuse_kinds, split_engine_name
from kvpool.engines.engine import Engine, EngineOptions

if TYPE_CHECKING:  # the engines' modules load with `entries` (`_entries`), not with the registry's names
    from kvpool.engines import emit
    from kvpool.models.weights import Parallel
    from kvpool.plan import PoolPlan
    from kvpool.plan.tiers import TierPlan

    ENTRIES: dict[str, Engine]
    RELEASES: dict[str, tuple[str, ...]]


NAMES = ("vllm", "sglang", "trtllm")  # the engines, the first the default (their entries: `entries.py`)
POLICY_PREFIX = "engine:"  # the simulator's policy naming an engine's own split
POLICIES = tuple(POLICY_PREFIX + name for name in NAMES)
NO_OPTIONS = EngineOptions()  # every engine option at its default


def entry(name: str) -> Engine:
    """The engine called `name` (a bare name, `name@release`, or an alias)."""
    return _entries()[engine_name(name)[0]]


def engine_name(name: str) -> tuple[str, str]:
    """`vllm` or `vllm@0.32` -> (engine, release); `EngineNotModelledError` for others."""
    return split_engine_name(name, _releases())


def of_policy(policy: str) -> Engine | None:
    """The engine a simulator policy `engine:NAME` names, None for kvpool's own policies."""
    if not policy.startswith(POLICY_PREFIX):
        return None
    name = policy.removeprefix(POLICY_PREFIX)
    if name not in NAMES:
        raise EngineNotModelledError(f"unknown policy {policy!r}; engine policies: {', '.join(POLICIES)}")
    return _entries()[name]


def admission_of(policy: str) -> str:
    """The admission rule the simulator runs for a plan's policy: its engine's for
    `engine:*`, else optimistic."""
    engine = of_policy(policy)
    return "optimistic" if engine is None else engine.admission


def engine_report(name: str, plan: PoolPlan, options: EngineOptions = NO_OPTIONS) -> EngineReport:
    """What engine `name` (ENGINE[@RELEASE]) would allocate by its own defaults from
    the plan's memory; options it does not take are refused by name."""
    engine, release = engine_name(name)
    e = _entries()[engine]
    check_options(e, options)
    refuse_kinds(plan.spec, e.kinds, e.title)
    return e.report(plan, release, options)


def check_options(e: Engine, options: EngineOptions) -> None:
    """EngineNotModelledError naming an option `e` does not take."""
    defaults = EngineOptions()
    given = [k for k in ("block_size", "async_scheduling") if getattr(options, k) != getattr(defaults, k)]
    flags = {"block_size": "--block-size", "async_scheduling": "--no-async-scheduling"}
    other = [k for k in given if k not in e.options]
    if other:
        owners = [x.name for x in _entries().values() if other[0] in x.options]
        raise EngineNotModelledError(
            f"{flags[other[0]]} is {'/'.join(owners) or 'no engine'}'s option ({e.name} takes none): "
            f"it needs --engine {'|'.join(owners)}"
        )


def launch(
    name: str, plan: PoolPlan, model_id: str, tiers: Sequence[TierPlan] = (), parallel: Parallel | None = None
) -> emit.Emitted:
    """The launch of engine `name` that follows `plan` on `parallel` (default: the
    plan's TP and PP), with its cold `tiers`' flags (emit.py)."""
    e = entry(name)
    refuse_kinds(plan.spec, e.kinds, e.title)
    from kvpool.engines import emit

    return emit.emit(e.name, plan, model_id, tiers, parallel)


@cache
def _entries() -> dict[str, Engine]:
    """`entries.ENTRIES`, loaded on first use: naming the engines and their
    policies (what `kvpool simulate` of kvpool's own policies asks) loads no
    engine's module."""
    from kvpool.engines.entries import ENTRIES

    return ENTRIES


@cache
def _releases() -> dict[str, tuple[str, ...]]:
    return {n: e.releases for n, e in _entries().items()}


def __getattr__(name: str) -> Any:
    """`ENTRIES` (engine name -> Engine) and `RELEASES` (engine name -> its
    releases, newest first), built on first use (`_entries`)."""
    if name == "ENTRIES":
        return _entries()
    if name == "RELEASES":
        return _releases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NAMES",
    "POLICIES",
    "POLICY_PREFIX",
    "Engine",
    "EngineOptions",
    "admission_of",
    "check_options",
    "engine_name",
    "engine_report",
    "entry",
    "launch",
    "of_policy",
]
