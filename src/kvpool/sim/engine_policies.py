"""Simulator policies `engine:vllm`, `engine:sglang`, `engine:trtllm`: each
engine's own split of the same memory, run through kvpool's manager and scheduler.

- `engine:sglang`, `engine:trtllm`: the engine's pools map one to one onto
  kvpool's groups (SGLang's tokens, TensorRT-LLM V1's blocks per window), turned
  into pages at the simulated page size.
- `engine:vllm`: vLLM's shared pool lets any group take any free block, so it
  follows the traffic's mix; it is simulated as the trace's workload split of the
  memory that holds real layers: the budget times the share of each block that
  is not padding (empty padding layers, Mamba state pages padded to the
  attention page). kvpool's manager keeps one pool per group, so the shared
  pool's moment-to-moment flexibility is approximated by that static split.
"""

from __future__ import annotations

import dataclasses

from kvpool.engines import sglang, trtllm, vllm
from kvpool.engines.common import EngineReport, per_layer_bytes
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.workload import Workload
from kvpool.spec import ModelSpec
from kvpool.trace import Trace

ENGINE_POLICIES = ("engine:vllm", "engine:sglang", "engine:trtllm")


def vllm_real_share(spec: ModelSpec, report: EngineReport) -> float:
    """The share of vLLM's allocated bytes that holds real layers' KV or state:
    every layer slot of a block has one (unified) page; padding slots hold
    nothing and a state layer fills `state / page` of its slot."""
    tensors, groups = int(report.reported["tensors"]), int(report.reported["kv_cache_groups"])
    layer_page = report.pools[0].page_bytes // tensors
    if groups == 1:
        return 1.0
    real = sum(len(g.layers) * (per_layer_bytes(g) / layer_page if g.kind == "state" else 1.0) for g in spec.groups)
    return min(1.0, real / (groups * tensors))


def engine_plan(
    spec: ModelSpec, limits: ServingLimits, policy: str, *, kv_memory_bytes: int, trace: Trace | None = None
) -> tuple[PoolPlan, tuple[str, ...]]:
    """The plan `engine:NAME` simulates, and notes on how it was made. Raises
    KvpoolError when the engine would refuse to start."""
    engine = policy.removeprefix("engine:")
    lim = dataclasses.replace(limits, avg_seq_len=None)
    if engine == "vllm":
        report = vllm.allocate(spec, lim, kv_memory_bytes)
        _refuse(policy, report)
        if trace is None:
            raise KvpoolError("policy engine:vllm needs a trace (its shared pool follows the traffic)")
        share = vllm_real_share(spec, report)
        plan = plan_pools(
            spec, lim, kv_memory_bytes=max(1, int(kv_memory_bytes * share)), policy=Workload(trace.lengths())
        )
        note = (
            f"engine:vllm: shared pool as the trace's split of the {share:.1%} of memory that holds "
            "real layers (padding excluded)"
        )
        return dataclasses.replace(plan, policy=policy), (note,)
    if engine == "sglang":
        report = sglang.allocate(spec, lim, kv_memory_bytes, max_running_requests=lim.max_batch_size)
    elif engine == "trtllm":
        report = trtllm.allocate(spec, lim, kv_memory_bytes)
    else:
        raise KvpoolError(f"unknown policy {policy!r}; engine policies: {', '.join(ENGINE_POLICIES)}")
    _refuse(policy, report)
    assert report.group_pages is not None
    plan = PoolPlan.from_pages(spec, dict(report.group_pages), lim, policy=policy)
    note = f"{policy}: {', '.join(report.lines[:2])}"
    return plan, (note,)


def _refuse(policy: str, report: EngineReport) -> None:
    if report.refusals:
        raise KvpoolError(f"{policy}: the engine would refuse to start: {report.refusals[0]}")
