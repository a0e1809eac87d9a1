"""Simulator policies `engine:vllm`, `engine:sglang`, `engine:trtllm`: each
engine's own split of the same memory, run through kvpool's manager and scheduler.

- `engine:sglang`, `engine:trtllm`: the engine's pools map one to one onto
  kvpool's groups (SGLang's tokens, TensorRT-LLM KV cache manager V2's slots by
  its own defaults), turned into pages at the simulated page size. V2 pool
  groups that hold several life cycles (equal slot sizes) become one shared pool
  when they hold every group.
- `engine:vllm`: vLLM v1's shared block pool itself. `engines.vllm.allocate`
  (at `--block-size` = the simulated page size) gives vLLM's KV-cache groups:
  layers cut into groups of equal layer count, the last of each type padded with
  empty layers, pages unified to one size, state pages padded to it, one group
  per state block a request holds. Each becomes a group of a regrouped spec
  whose page is one block, and all of them draw from one pool of vLLM's
  `num_gpu_blocks` (`PoolPlan.from_shared_pool`): any group takes any free
  block, sliding groups give back the blocks that leave the window. Where vLLM
  raised some groups' block size to unify pages (Gemma 4's global layers: 2 x),
  the spec's page is the smallest block and a group whose block covers k times
  fewer tokens appears k times (its pages cost k units): bytes are exact, the
  larger blocks are allocated at the smaller granularity. The page size is the
  smallest block (vLLM raises it for state models: Qwen3-Next's 544 tokens).
"""

from __future__ import annotations

import dataclasses

from kvpool.engines import registry
from kvpool.engines.common import EngineNotModelledError, EngineReport
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import LayerGroup, ModelSpec
from kvpool.trace import Trace

ENGINE_POLICIES = registry.POLICIES
SHARED_POOL = "vllm-shared"  # name of the simulated shared block pool


def vllm_shared_plan(
    spec: ModelSpec, limits: ServingLimits, report: EngineReport, policy: str = "engine:vllm"
) -> PoolPlan:
    """vLLM's shared block pool as a `PoolPlan` over a regrouped spec: one group
    per KV-cache group (state: per state block; a group whose block covers fewer
    tokens than the largest repeated to make up the unit), all drawing from one
    pool; `plan.origin` maps each back to the model's group."""
    pool = report.pools[0]
    members = pool.members
    unit_tokens = min(m.tokens_per_block for m in members if m.kind != "state")
    widest = max(m.tokens_per_block for m in members if m.kind != "state")
    if pool.page_bytes % widest or widest % unit_tokens:
        raise EngineNotModelledError(f"{spec.name}: vLLM's blocks do not split into pages of {unit_tokens} tokens")
    row_bytes = pool.page_bytes // widest  # bytes per position in a page of the smallest block
    origin_of = {m.name: _origin(spec, m.name) for m in members}
    chunk: dict[str, int] = {}  # per model group: next chunk of its layers
    groups: list[LayerGroup] = []
    origin: dict[str, str] = {}
    for m in members:
        home = spec.group(origin_of[m.name])
        per_block = widest // (m.tokens_per_block if m.kind != "state" else unit_tokens)
        j = chunk.get(home.name, 0)
        size = int(report.reported["tensors"])
        layers = home.layers[j * size : (j + 1) * size] if m.kind != "state" else home.layers
        chunk[home.name] = j + (m.kind != "state")
        for r in range(per_block):
            name = m.name if per_block == 1 else f"{m.name}.{r}"
            if m.kind == "state":
                g = LayerGroup(name, "state", layers, unit_tokens, state_bytes=row_bytes * unit_tokens)
            else:
                g = LayerGroup(name, m.kind, layers, unit_tokens, row_bytes=row_bytes, window=m.window)
            groups.append(g)
            origin[name] = home.name
    regrouped = dataclasses.replace(spec, groups=tuple(groups), tokens_per_block=unit_tokens)
    # vLLM's block pool holds one null block back: requests draw from the rest.
    pages = int(report.reported.get("usable_blocks", pool.pages)) * (widest // unit_tokens)
    return PoolPlan.from_shared_pool(regrouped, pages, limits, name=SHARED_POOL, policy=policy, origin=origin)


def _origin(spec: ModelSpec, member: str) -> str:
    """The model group a vLLM member (`group.i` or `group.i.j`) holds layers of."""
    for name in sorted(spec.group_names, key=len, reverse=True):
        if member.startswith(name + "."):
            return name
    raise EngineNotModelledError(f"vLLM group {member!r} matches no group of {spec.name}")


def engine_plan(
    spec: ModelSpec, limits: ServingLimits, policy: str, *, kv_memory_bytes: int, trace: Trace | None = None
) -> tuple[PoolPlan, tuple[str, ...]]:
    """The plan `engine:NAME` simulates, and notes on how it was made. Raises
    KvpoolError when the engine would refuse to start."""
    engine = registry.of_policy(policy)
    if engine is None:
        raise KvpoolError(f"unknown policy {policy!r}; engine policies: {', '.join(ENGINE_POLICIES)}")
    lim = dataclasses.replace(limits, avg_seq_len=None)
    report = engine.split(spec, lim, kv_memory_bytes)
    _refuse(policy, report)
    if engine.shared_pool:  # one block pool for every KV cache group (vLLM)
        plan = vllm_shared_plan(spec, lim, report, policy)
        padding = int(report.reported["padding_layers"])
        note = (
            f"{policy}: one shared pool of {report.reported['num_gpu_blocks']:,} blocks "
            f"({plan.shared[0].pages:,} pages of {plan.spec.tokens_per_block} tokens) for "
            f"{report.reported['kv_cache_groups']} KV-cache groups of {report.reported['tensors']} layers"
            + (f", {padding} of them padding" if padding else "")
            + f"; {report.lines[0]}"
            + (
                f"; the drafter's layers ({', '.join(g.name for g in spec.draft_groups)}) are in the KV-cache groups "
                "of the target's layers of their spec, counted there"
                if spec.draft_groups
                else ""
            )
        )
        return plan, (note,)
    if report.group_pages is None:  # pools shared by several groups (V2's equal-slot life cycles)
        if len(report.pools) != 1:
            raise EngineNotModelledError(
                f"{policy}: pool groups {[p.name for p in report.pools]} share slots among some "
                "groups only; kvpool simulates one shared pool or one pool per group"
            )
        shared = PoolPlan.from_shared_pool(spec, report.pools[0].pages, lim, name=SHARED_POOL, policy=policy)
        return shared, (f"{policy}: one pool group, {report.lines[0]}",)
    assert report.group_pages is not None
    plan = PoolPlan.from_pages(spec, dict(report.group_pages), lim, policy=policy)
    note = f"{policy}: {', '.join(report.lines[:2])}"
    return plan, (note,)


def _refuse(policy: str, report: EngineReport) -> None:
    if report.refusals:
        raise KvpoolError(f"{policy}: the engine would refuse to start: {report.refusals[0]}")
