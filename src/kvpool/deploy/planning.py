"""`plan`: split one rank's KV budget between a model's page pools (`kvpool plan`),
with what an engine would allocate instead, the launch that follows the plan, and
the cold tiers below it.

`sizing`: `workload` (default; with `workload=TRACE` the expected decode pages of
its lengths), `occupancy` (pages over each request's time in flight) or `tuned`
(a bounded search simulated on a sample of the trace, `kvpool.sim.policies`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Unpack

from kvpool.deploy.launch import check_engine_options, launch_for, launch_model_id, report_for
from kvpool.deploy.options import PlanKeywords, PlanRequest
from kvpool.deploy.resolution import Resolved, resolve
from kvpool.deploy.tiers import TierOptions
from kvpool.engines import registry
from kvpool.engines.common import EngineReport
from kvpool.engines.emit import Emitted
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.tiers import TierPlan
from kvpool.units import format_bytes

Sizing = Literal["workload", "occupancy", "tuned"]
SIZINGS: tuple[Sizing, ...] = ("workload", "occupancy", "tuned")


@dataclass(frozen=True)
class PlanResult:
    """What `plan` answers: the plan, the resolved request it came from (spec,
    limits, budget), an engine's own allocation (`report`, with `engine`), the
    launch that follows the plan (`emitted`, with `emit`), one rank's cold tiers,
    and a note when max_seq_len was capped below the model's positions.
    `to_dict()` is what `kvpool plan --json` prints."""

    plan: PoolPlan
    resolved: Resolved
    report: EngineReport | None = None
    emitted: Emitted | None = None
    tiers: tuple[TierPlan, ...] = ()
    length_note: str | None = None

    @property
    def memory(self) -> MemoryBudget | None:
        """The whole-GPU breakdown per rank (None when the budget was given)."""
        return self.resolved.budget.memory

    def to_dict(self) -> dict[str, Any]:
        """With a launch: the launch (its `engine_default` the engine's report);
        else the plan (its `engine` the report), the memory per rank and the tiers."""
        avg = self.plan.avg_seq_len
        if self.emitted is not None:
            out = self.emitted.to_json()
            if self.report is not None:
                out["engine_default"] = self.report.to_json(avg)
        else:
            out = self.plan.to_json()
            if self.report is not None:
                out["engine"] = self.report.to_json(avg)
        if self.length_note and isinstance(out.get("notes"), list):
            out["notes"].append(self.length_note)
        if self.memory is not None and self.emitted is None:
            out["memory"] = self.memory.to_json()
        if self.tiers:
            out["tiers"] = [t.to_json() for t in self.tiers]
        return out


def plan(
    model: str,
    *,
    gpu: str | None = None,
    engine: str | None = None,
    emit: str | None = None,
    model_id: str | None = None,
    block_size: int | None = None,
    async_scheduling: bool = True,
    sizing: Sizing = "workload",
    sim_gpu: str | None = None,
    workload_rate: float | str | None = None,
    host_memory: int | str | None = None,
    disk: int | str | None = None,
    host_rule: str = "even",
    ranks_per_node: int | None = None,
    **options: Unpack[PlanKeywords],
) -> PlanResult:
    """Split one rank's KV budget between the page pools of `model`. The budget is
    `kv_memory`, or the whole GPU per rank (`gpu`: GPU memory x utilization -
    weights - activations - CUDA graphs - reserve), or (GPU - `non_kv_memory`) x F.
    `engine` (ENGINE[@RELEASE]): what that engine would allocate instead, by its
    own rules (`block_size`, `async_scheduling`: vLLM's); `emit` (vllm, sglang,
    trtllm): the launch that makes it follow the plan, naming `model_id`.
    `sizing` with `workload=TRACE`: see the module docstring (`tuned` simulates
    on `sim_gpu`, default `gpu`, at `workload_rate` requests/s, inf or "trace").
    `host_memory` (one node's, for KV), `disk` (per rank), `host_rule`,
    `ranks_per_node`: the cold tiers per rank. `options`: the `PlanKeywords`.
    Raises KvpoolError on bad input or a constraint that does not fit (rule 3 of
    docs/design.md; `shrink_to_fit=True` shrinks it instead)."""
    if sizing not in SIZINGS:
        raise KvpoolError(f"--sizing {sizing!r}: choose one of {', '.join(SIZINGS)}")
    request = PlanRequest.of(model, gpu, **options)
    resolved = resolve(request, gpu_only_for_budget=sizing != "tuned")  # tuned times steps on --gpu
    pools = sized_plan(resolved, sizing, sim_gpu, workload_rate)
    if request.shrink_to_fit and not pools.max_concurrency()["max_seq_len"]:
        raise unusable(pools)
    tier_options = TierOptions(
        None if host_memory is None else str(host_memory),
        None if disk is None else str(disk),
        host_rule,
        ranks_per_node,
    )
    tier_options.check()
    m = request.model
    tiers = tier_options.per_rank(pools, m.tp, m.pp)
    own = registry.EngineOptions(block_size, async_scheduling)
    check_engine_options(engine, emit, model_id, own)
    report = report_for(engine, pools, own)
    emitted = None
    if emit is not None:
        launch_id = launch_model_id(pools, m.model, model_id)
        emitted = launch_for(emit, pools, launch_id, resolved.budget.memory, tiers, m.parallel)
    return PlanResult(pools, resolved, report, emitted, tuple(tiers), default_length_note(request, pools))


def unusable(pools: PoolPlan) -> KvpoolError:
    """shrink_to_fit promises a usable plan: one that holds no request of max_seq_len is not one."""
    shrunk = [max(b.capacity for b in c.batch) for c in pools.constraints if c.shrunk_from is not None]
    hint = f"--max-seq-len {min(shrunk)}" if shrunk else "a lower --max-seq-len"
    return KvpoolError(
        f"--fit: {format_bytes(pools.budget_bytes)} of KV holds no request of max_seq_len "
        f"{pools.limits.max_seq_len:,}; give {hint} (the longest its constraints fit) or more memory"
    )


def sized_plan(resolved: Resolved, sizing: Sizing, sim_gpu: str | None, workload_rate: float | str | None) -> PoolPlan:
    """The plan of the sizing policy asked for (workload: the plain plan)."""
    # an option that means nothing without the one it depends on is refused, not ignored
    if sizing != "tuned":
        for given, name in ((sim_gpu, "--sim-gpu"), (workload_rate, "--workload-rate")):
            if given is not None:
                raise KvpoolError(f"{name} is for --sizing tuned (the other sizings time no steps)")
    if sizing == "workload":
        return resolved.plan()
    req = resolved.request
    if req.workload is None:
        raise KvpoolError(f"--sizing {sizing} needs --workload TRACE")
    if req.pool_ratio is not None:
        raise KvpoolError(f"give --pool-ratio or --sizing {sizing}, not both")
    if req.phase != "final":
        raise KvpoolError(f"--sizing {sizing} plans the final phase; drop --phase profile")
    from kvpool.deploy.adaptive import adaptive_plan  # the simulator, only for these sizings

    return adaptive_plan(resolved, sizing, sim_gpu, "inf" if workload_rate is None else workload_rate)


def default_length_note(request: PlanRequest, pools: PoolPlan) -> str | None:
    """Why L is below the model's positions when max_seq_len was not given."""
    max_pos, length = pools.spec.max_position_embeddings, pools.limits.max_seq_len
    if request.limits.max_seq_len is not None or not max_pos or max_pos <= length:
        return None
    return (
        f"max_seq_len defaults to {length:,}, below the model's {max_pos:,} positions: planning every request "
        f"at full context would reserve pages most deployments never use; give --max-seq-len {max_pos} for it"
    )
