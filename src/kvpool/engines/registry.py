"""The one engine registry: engine name -> its model, the kinds it models, its
flags, its launch emitter, its budgets and its releases.

Nothing outside `kvpool.engines` branches on an engine's name: the CLI, the
simulator and the fit answer ask `entry(name)` (or iterate `ENTRIES`) for what
differs between engines. A new engine is one `Engine` here plus its module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpool.engines import budgets, emit, sglang, trtllm, vllm
from kvpool.engines.common import EngineNotModelledError, EngineReport, refuse_kinds, split_engine_name
from kvpool.models.weights import Parallel
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.tiers import TierPlan
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


def _vllm_report(plan: PoolPlan, release: str, options: EngineOptions) -> EngineReport:
    return vllm.allocate(
        emit.at_max_positions(plan.spec),
        plan.limits,
        plan.budget_bytes,
        block_size=options.block_size,
        async_scheduling=options.async_scheduling,
        release=release,
    )


def _sglang_report(plan: PoolPlan, release: str, options: EngineOptions) -> EngineReport:
    return sglang.allocate(plan.spec, plan.limits, plan.budget_bytes, max_running_requests=plan.limits.max_batch_size)


def _trtllm_report(plan: PoolPlan, release: str, options: EngineOptions) -> EngineReport:
    manager = "v1" if release == "v1" else "v2-default"
    return trtllm.allocate(plan.spec, plan.limits, plan.budget_bytes, manager=manager)


# Each engine's own split at the spec's page size, as the simulator runs it (`engine:NAME`).
def _vllm_split(spec: ModelSpec, limits: ServingLimits, kv_bytes: int) -> EngineReport:
    return vllm.allocate(spec, limits, kv_bytes, block_size=spec.tokens_per_block)


def _sglang_split(spec: ModelSpec, limits: ServingLimits, kv_bytes: int) -> EngineReport:
    return sglang.allocate(spec, limits, kv_bytes, max_running_requests=limits.max_batch_size)


def _trtllm_split(spec: ModelSpec, limits: ServingLimits, kv_bytes: int) -> EngineReport:
    return trtllm.allocate(spec, limits, kv_bytes, manager="v2-default")


ENTRIES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(
            "vllm",
            "vLLM",
            vllm.RELEASES,
            vllm.KINDS,
            ("block_size", "async_scheduling"),
            "optimistic",
            True,
            "batches up to {top} run on graphs ({n} sizes, a batch padded up to the next one); larger run eager",
            _vllm_report,
            emit.emit_vllm,
            budgets.vllm_flags,
            budgets.vllm_default,
            _vllm_split,
        ),
        Engine(
            "sglang",
            "SGLang",
            sglang.RELEASES,
            sglang.KINDS,
            (),
            "sglang",
            False,
            "batches up to {top} (cuda_graph_max_bs, {n} sizes) run on graphs; larger run eager",
            _sglang_report,
            emit.emit_sglang,
            budgets.sglang_flags,
            budgets.sglang_default,
            _sglang_split,
        ),
        Engine(
            "trtllm",
            "TensorRT-LLM",
            trtllm.RELEASES,
            trtllm.KINDS,
            (),
            "guaranteed",
            False,
            "batches of a captured size up to {top} run on graphs ({n} sizes; others too with "
            "cuda_graph_config.enable_padding: true); larger run eager",
            _trtllm_report,
            emit.emit_trtllm,
            budgets.trtllm_flags,
            budgets.trtllm_default,
            _trtllm_split,
        ),
    )
}
NAMES = tuple(ENTRIES)
RELEASES = {name: e.releases for name, e in ENTRIES.items()}
POLICY_PREFIX = "engine:"  # the simulator's policy naming an engine's own split
POLICIES = tuple(POLICY_PREFIX + name for name in NAMES)


def entry(name: str) -> Engine:
    """The engine called `name` (a bare name, `name@release`, or an alias)."""
    return ENTRIES[engine_name(name)[0]]


def engine_name(name: str) -> tuple[str, str]:
    """`vllm` or `vllm@0.32` -> (engine, release); `EngineNotModelledError` for others."""
    return split_engine_name(name, RELEASES)


def of_policy(policy: str) -> Engine | None:
    """The engine a simulator policy `engine:NAME` names, None for kvpool's own policies."""
    if not policy.startswith(POLICY_PREFIX):
        return None
    name = policy.removeprefix(POLICY_PREFIX)
    if name not in ENTRIES:
        raise EngineNotModelledError(f"unknown policy {policy!r}; engine policies: {', '.join(POLICIES)}")
    return ENTRIES[name]


def admission_of(policy: str) -> str:
    """The admission rule the simulator runs for a plan's policy: its engine's for
    `engine:*`, else optimistic."""
    engine = of_policy(policy)
    return "optimistic" if engine is None else engine.admission


def engine_report(name: str, plan: PoolPlan, options: EngineOptions = EngineOptions()) -> EngineReport:
    """What engine `name` (ENGINE[@RELEASE]) would allocate by its own defaults from
    the plan's memory; options it does not take are refused by name."""
    engine, release = engine_name(name)
    e = ENTRIES[engine]
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
        owners = [x.name for x in ENTRIES.values() if other[0] in x.options]
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
    return emit.emit(e.name, plan, model_id, tiers, parallel)
