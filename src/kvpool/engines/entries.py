"""The registry's entries: each engine's `Engine`, with the functions of its
module. `registry.py` names the engines and loads this module (and with it
their models, emitters and budgets) on its first look-up of an entry: a
simulation of kvpool's own policies needs none of them."""

from __future__ import annotations

from kvpool.engines import budgets, emit, sglang, trtllm, vllm
from kvpool.engines.common import EngineReport
from kvpool.engines.engine import Engine, EngineOptions
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import ModelSpec


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
