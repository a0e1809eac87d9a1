"""The launch that makes an engine follow a plan (`plan(emit=...)`, and each
engine's answer in `fit`): the model id it names, the engine's own report of what
it would allocate instead, and the flags the launch lines cannot state yet."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvpool.deploy.engine_fit import with_budget_flag
from kvpool.engines.common import EngineReport
from kvpool.engines.emit import Emitted, emit, engine_name, engine_report, model_id_for
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.tiers import TierPlan


def launch_model_id(plan: PoolPlan, model: str, given: str | None) -> str:
    """The model id a launch line names: `given` (--model-id), else the hub id the
    plan was read from, else the preset's Hugging Face id, else MODEL."""
    source = plan.spec.source
    hub_id = source.repo_id if source is not None and source.kind == "hub" else None
    return given or hub_id or model_id_for(model)


def check_engine_options(
    engine: str | None, emit_engine: str | None, model_id: str | None, block_size: int | None, async_scheduling: bool
) -> None:
    """Refuse the engine options that mean nothing without the one they qualify
    (vLLM's block size and scheduling without engine vllm, a launch's model id
    without emit) rather than ignore them."""
    vllm = engine is not None and engine_name(engine)[0] == "vllm"
    if not vllm and block_size is not None:
        raise KvpoolError("--block-size is vLLM's: it needs --engine vllm")
    if not vllm and async_scheduling is False:
        raise KvpoolError("--no-async-scheduling is vLLM's: it needs --engine vllm")
    if emit_engine is None and model_id is not None:
        raise KvpoolError("--model-id names the model in the --emit launch: it needs --emit")


def report_for(
    engine: str | None, plan: PoolPlan, block_size: int | None, async_scheduling: bool
) -> EngineReport | None:
    """What `engine` (ENGINE[@RELEASE]) would allocate from the plan's memory by
    its own rules, or None without one."""
    if engine is None:
        return None
    return engine_report(engine, plan, block_size=block_size, async_scheduling=async_scheduling)


def launch_for(
    engine: str,
    plan: PoolPlan,
    model: str,
    model_id: str | None,
    memory: MemoryBudget | None,
    tiers: Sequence[TierPlan],
    beyond_tp: Sequence[str],
) -> Emitted:
    """The launch of `engine` that follows `plan` (`memory`: the whole-GPU
    breakdown, when known, states SGLang's budget as --mem-fraction-static;
    `tiers`: one rank's cold tiers, stated as the engine's offload flags).
    `beyond_tp`: the parallel options the launch lines cannot carry yet, refused."""
    if beyond_tp:  # the launch lines carry tensor parallelism only: refuse rather than emit a wrong one
        raise KvpoolError(f"--emit does not yet state {', '.join(beyond_tp)} as engine flags; plan without them")
    emitted = with_budget_flag(emit(engine, plan, launch_model_id(plan, model, model_id), tiers), memory)
    source = plan.spec.source
    if source is not None and source.kind == "hub" and source.repo_id and source.revision != "main":
        # an engine takes the revision as its own option, never as id@revision
        note = f"planned from {source.repo_id} at revision {source.revision}: give the engine that revision too"
        emitted = dataclasses.replace(emitted, notes=(*emitted.notes, note))
    return emitted
