"""The launch that makes an engine follow a plan (`plan(emit=...)`, and each
engine's answer in `fit`): the model id it names, the engine's own report of what
it would allocate instead, and the options only one engine takes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvpool.deploy.engine_fit import with_budget_flag
from kvpool.engines import registry
from kvpool.engines.common import EngineReport
from kvpool.engines.emit import Emitted
from kvpool.engines.hf_ids import model_id_for
from kvpool.errors import KvpoolError
from kvpool.models.weights import Parallel
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
    engine: str | None, emit_engine: str | None, model_id: str | None, options: registry.EngineOptions
) -> None:
    """Refuse the options that mean nothing without the one they qualify (an
    engine's own option without `engine` naming that engine, a launch's model id
    without `emit_engine`) rather than ignore them."""
    if engine is not None:
        registry.check_options(registry.entry(engine), options)
    elif options != registry.EngineOptions():
        flag = "--block-size" if options.block_size is not None else "--no-async-scheduling"
        owners = [e.name for e in registry.ENTRIES.values() if e.options]
        raise KvpoolError(f"{flag} is an engine's option: it needs --engine {'|'.join(owners)}")
    if emit_engine is None and model_id is not None:
        raise KvpoolError("--model-id names the model in the --emit launch: it needs --emit")


def report_for(engine: str | None, plan: PoolPlan, options: registry.EngineOptions) -> EngineReport | None:
    """What `engine` (ENGINE[@RELEASE]) would allocate from the plan's memory by
    its own rules, or None without one."""
    return None if engine is None else registry.engine_report(engine, plan, options)


def launch_for(
    engine: str,
    plan: PoolPlan,
    model_id: str,
    memory: MemoryBudget | None,
    tiers: Sequence[TierPlan],
    parallel: Parallel,
) -> Emitted:
    """The launch of `engine` that follows `plan` on `parallel`, naming `model_id`
    (`memory`: the whole-GPU breakdown, when known, states SGLang's budget as
    --mem-fraction-static; `tiers`: one rank's cold tiers, as the engine's offload flags)."""
    emitted = with_budget_flag(registry.launch(engine, plan, model_id, tiers, parallel), memory)
    source = plan.spec.source
    if source is not None and source.kind == "hub" and source.repo_id and source.revision != "main":
        # an engine takes the revision as its own option, never as id@revision
        note = f"planned from {source.repo_id} at revision {source.revision}: give the engine that revision too"
        emitted = dataclasses.replace(emitted, notes=(*emitted.notes, note))
    return emitted
