"""The `kv` router: routes on what the workers' caches hold, read from their
own KV events through kvpool's prefix index (`kvpool.index.PrefixIndex`, the
index a real router could run), each event seen `event_lag_s` after it was
emitted (Dynamo's mocker: `kv_event_lag_ms`; prefill completions and finished
requests stay immediate, as a live router sees them in-band).

Two rules, as the engines' routers define them:

- `dynamo` (the default): the lowest cost
  `overlap_weight x max(0, prefill blocks - cached credit) + decode blocks`,
  Dynamo's default worker selector (`lib/kv-router/src/scheduling/selector`,
  `DefaultWorkerScorer::worker_logit`): prefill blocks are the worker's
  prompt tokens still waiting for prefill plus this prompt, over the block
  size; the credit is the prompt's blocks cached on the GPU plus 0.75 x those
  only on the host and 0.25 x those only on disk; decode blocks are the
  distinct prompt blocks of the worker's requests in flight with this one's
  added. Defaults of Dynamo 1.6.1's `KvRouterConfig`: `prefill_load_scale`
  (the deprecated `overlap_score_weight`) 1.0, `overlap_score_credit` 1.0,
  `host_cache_hit_weight` 0.75, `disk_cache_hit_weight` 0.25,
  `router_temperature` 0 (no sampling: the lowest cost wins);
- `sglang`: SGLang's cache-aware rule (`routers.CacheAware`) on the index
  instead of an approximate tree: the match is the tokens cached on the GPU,
  the smallest cache the fewest GPU blocks the index holds for the worker.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.cache.prefix_hit import TierHit
from kvpool.fleet.load import RouteRequest, RouterError
from kvpool.fleet.router_names import KV_VARIANTS
from kvpool.fleet.routers import CacheAware, Router, lowest
from kvpool.index import PrefixIndex
from kvpool.spec.groups import LayerGroup
from kvpool.units import is_positive_int


@dataclass(frozen=True)
class KvCost:
    """Dynamo's worker cost, in blocks (module docstring; defaults: Dynamo
    1.6.1's `KvRouterConfig`)."""

    overlap_weight: float = 1.0
    host_hit_weight: float = 0.75
    disk_hit_weight: float = 0.25

    def __post_init__(self) -> None:
        if min(self.overlap_weight, self.host_hit_weight, self.disk_hit_weight) < 0:
            raise RouterError("the kv router's weights must not be negative")

    def credit(self, hit: TierHit, block_size: int) -> float:
        """Cached blocks the prompt need not prefill on this worker: the GPU's in
        full, the host's and the disk's beyond it at their weights."""
        gpu, cpu, disk = (t // block_size for t in hit)
        return gpu + self.host_hit_weight * (cpu - gpu) + self.disk_hit_weight * (disk - cpu)

    def cost(self, prompt: int, block_size: int, waiting_prefill: int, hit: TierHit, decode_blocks: int) -> float:
        """A worker's cost for a prompt of `prompt` tokens when `waiting_prefill`
        tokens already wait for its prefill, `hit` is cached there, and its
        requests in flight would hold `decode_blocks` distinct blocks with this one."""
        prefill_blocks = (waiting_prefill + prompt) / block_size
        return self.overlap_weight * max(0.0, prefill_blocks - self.credit(hit, block_size)) + decode_blocks


class KvRouter(Router):
    """Routes on the prefix index fed by the workers' events (module
    docstring). `block_size`: the workers' page size (the events' block
    size); `groups`: the workers' groups (else learned from the events);
    `event_lag_s`: how long after its emission an event reaches the index."""

    name = "kv"
    VARIANTS = KV_VARIANTS

    def __init__(
        self,
        workers: int,
        block_size: int = 16,
        variant: str = "dynamo",
        event_lag_s: float = 0.0,
        groups: Sequence[LayerGroup] | None = None,
        overlap_weight: float = KvCost.overlap_weight,
        host_hit_weight: float = KvCost.host_hit_weight,
        disk_hit_weight: float = KvCost.disk_hit_weight,
        cache_threshold: float = CacheAware.cache_threshold,
        balance_abs_threshold: int = CacheAware.balance_abs_threshold,
        balance_rel_threshold: float = CacheAware.balance_rel_threshold,
    ) -> None:
        super().__init__(workers)
        if variant not in self.VARIANTS:
            raise RouterError(f"unknown kv router variant {variant!r}; variants: {', '.join(self.VARIANTS)}")
        if not is_positive_int(block_size) or not event_lag_s >= 0:
            raise RouterError(
                f"block_size must be a positive int and event_lag_s >= 0, got {block_size!r}, {event_lag_s!r}"
            )
        self.variant = variant
        self.block_size = block_size
        self.event_lag_s = float(event_lag_s)
        self.costs = KvCost(overlap_weight, host_hit_weight, disk_hit_weight)
        self.rule = CacheAware(cache_threshold, balance_abs_threshold, balance_rel_threshold)
        self.index = PrefixIndex(block_size)
        for w in range(workers):
            self.index.add_worker(w, groups)
        self.pending: list[tuple[float, int, int, list[Any]]] = []  # (due, order, worker, events): a heap
        self.observed = 0
        self.last: tuple[Hashable, dict[Hashable, TierHit], list[int]] | None = None

    # ------------------------------------------------------------------ events

    def observe(self, worker: int, events: Iterable[Any], now: float = 0.0) -> None:
        """`worker`'s events emitted at `now`: the index applies them once
        `event_lag_s` has passed (at once without lag), in emission order."""
        self.check_worker(worker)
        heapq.heappush(self.pending, (now + self.event_lag_s, self.observed, worker, list(events)))
        self.observed += 1
        self.advance(now)

    def advance(self, now: float) -> None:
        """Apply every event whose lag has passed by `now`."""
        while self.pending and self.pending[0][0] <= now:
            _, _, worker, events = heapq.heappop(self.pending)
            self.index.apply(worker, events)

    # ------------------------------------------------------------------ routing

    def lookup(self, request: RouteRequest) -> tuple[dict[Hashable, TierHit], list[int]]:
        """What the index says each worker holds of the prompt, and the prompt's block keys."""
        if self.last is None or self.last[0] != request.request_id:
            hits = self.index.query(request.token_ids, request.salt)
            self.last = (request.request_id, hits, request.block_keys(self.block_size))
        return self.last[1], self.last[2]

    def choose(self, request: RouteRequest, now: float) -> int:
        hits, keys = self.lookup(request)
        prompt = len(request.token_ids)
        if self.variant == "sglang":
            matched = [hits[w].gpu for w in range(self.workers)]
            sizes = [self.index.gpu_blocks(w) for w in range(self.workers)]
            return self.rule.choose(self.loads.requests, matched, prompt, sizes)
        loads = self.loads
        return lowest(
            [
                self.costs.cost(prompt, self.block_size, loads.prefill_tokens[w], hits[w], loads.blocks_with(w, keys))
                for w in range(self.workers)
            ]
        )

    def record(self, worker: int, request: RouteRequest, now: float) -> None:
        hits, keys = self.lookup(request)
        cached = hits[worker].gpu
        self.loads.add(worker, request.request_id, len(request.token_ids) - cached, keys)
        self.last = None
