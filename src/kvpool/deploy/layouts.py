"""`fit(users=N, length=L)` (`kvpool fit --users N --len L`): the layouts (GPU count, tensor / pipeline
parallel sizes, data-parallel replicas) whose KV pools hold N requests of L
positions decoding at once, smallest first.

Each replica is one engine of tp x pp GPUs serving ceil(N / replicas) requests
(its max_num_seqs); its budget is the whole-GPU budget per rank (deploy/budget.py)
and its capacity kvpool's plan at max_seq_len L. The config is read once; each
(tp, pp) builds its spec once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvpool.deploy.budget import kv_budget
from kvpool.deploy.options import PlanRequest
from kvpool.deploy.resolution import ConfigRead, Resolved, check_positions, model_spec, serving_limits
from kvpool.errors import KvpoolError
from kvpool.plan import plan_pools
from kvpool.spec import ModelSpec
from kvpool.spec.loader import read_model_config

# within a node powers of two; beyond, whole 8-GPU nodes
GPU_COUNTS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
# Tensor parallelism stays inside one 8-GPU node (NVLink); pipeline stages span nodes.
TP_SIZES = (1, 2, 4, 8)
PP_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Layout:
    """One layout and what it holds (`reason`: why it holds nothing, else None)."""

    gpus: int
    tp: int
    pp: int
    replicas: int
    per_replica: int = 0
    kv_bytes: int = 0
    reason: str | None = None
    resolved: Resolved | None = None

    @property
    def holds(self) -> int:
        """Requests of L positions all replicas hold at once."""
        return self.replicas * self.per_replica

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "tp": self.tp,
            "pp": self.pp,
            "replicas": self.replicas,
            "kv_bytes_per_rank": self.kv_bytes,
            "requests_per_replica": self.per_replica,
            "requests_held": self.holds,
            "reason": self.reason,
        }


def candidates(max_gpus: int) -> Iterator[tuple[int, int, int]]:
    """(gpus, tp, pp) by GPU count, then fewer pipeline stages, then less tensor parallelism."""
    for gpus in (g for g in GPU_COUNTS if g <= max_gpus):
        for pp in PP_SIZES:
            for tp in TP_SIZES:
                if tp * pp <= gpus and gpus % (tp * pp) == 0:
                    yield gpus, tp, pp


def search(request: PlanRequest, users: int, length: int, max_gpus: int) -> list[Layout]:
    """Every candidate layout up to `max_gpus`, in `candidates` order, until the
    GPU count after the first one that holds `users` (so the answer shows the
    smallest layouts and the next size up)."""
    read = read_model_config(request.model.model)
    check_positions(read[2], length, "--len")
    specs: dict[tuple[int, int], ModelSpec | str] = {}
    out: list[Layout] = []
    enough_at: int | None = None
    for gpus, tp, pp in candidates(max_gpus):
        if enough_at is not None and gpus > enough_at + max(8, enough_at // 2):
            break
        if (tp, pp) not in specs:
            specs[tp, pp] = layout_spec(read, request, tp, pp, length)
        layout = Layout(gpus, tp, pp, gpus // (tp * pp))
        spec = specs[tp, pp]
        if isinstance(spec, str):
            out.append(dataclasses.replace(layout, reason=spec))
            continue
        out.append(evaluate(layout, request.with_layout(tp, pp), spec, users, length))
        if out[-1].holds >= users and enough_at is None:
            enough_at = gpus
    return out


def layout_spec(read: ConfigRead, request: PlanRequest, tp: int, pp: int, length: int) -> ModelSpec | str:
    """The spec of one rank of tp x pp at `length`, or why there is none (a tp
    that does not divide the heads is refused, as vLLM refuses it)."""
    try:
        return model_spec(request.with_layout(tp, pp).model, read, length)
    except KvpoolError as e:
        return str(e)


def evaluate(layout: Layout, request: PlanRequest, spec: ModelSpec, users: int, length: int) -> Layout:
    """`layout` with what one replica holds at `length` (or why it holds nothing)."""
    per_replica_users = -(-users // layout.replicas)
    asked = dataclasses.replace(request.limits, max_batch_size=per_replica_users, max_seq_len=length)
    try:
        lim = serving_limits(asked, length)
        kv = kv_budget(request.budget, request.model, spec, lim, gpu_only_for_budget=False)
        plan = plan_pools(spec, lim, kv_memory_bytes=kv.kv_bytes)
    except KvpoolError as e:
        return dataclasses.replace(layout, reason=str(e))
    held = int(plan.max_concurrency()["max_seq_len"] or 0)
    resolved = Resolved(dataclasses.replace(request, limits=asked), spec, lim, kv)
    return dataclasses.replace(layout, per_replica=held, kv_bytes=kv.kv_bytes, resolved=resolved)


def ranked(layouts: list[Layout], users: int) -> list[Layout]:
    """The layouts that hold `users`: fewest GPUs, then fewest pipeline stages (each
    adds a hop per token), then the most requests held."""
    good = [x for x in layouts if x.holds >= users]
    return sorted(good, key=lambda x: (x.gpus, x.pp, -x.holds, x.tp))
