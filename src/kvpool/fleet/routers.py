"""Routers: which replica of a fleet serves each request.

Every router is a small object behind one interface (`Router`), built for a
fixed number of workers (replicas, numbered 0..n-1) and driven by the fleet's
event loop:

- `route(request, now)` picks a worker and records the request as in flight
  on it (its load; the prefix router's tree);
- `prefilled(request_id, now)` when the request's first token is out (its
  prompt no longer waits for prefill), `finished(request_id, now)` when it
  ends: load bookkeeping, immediate (a live router sees both in-band on the
  response path);
- `observe(worker, events, now)` hands over the worker's KV events (decoded
  vLLM events, `kvpool.cache.kv_wire.wire_events`); only the kv router reads
  them, after its event lag.

Deterministic: the same calls in the same order give the same choices; ties
go to the lowest worker index (Dynamo picks among tied workers at random,
SGLang takes the first in its iteration order). Not thread-safe.

Routers: `round-robin`; `least-load` (fewest requests in flight);
`prefix` (SGLang's cache-aware rule on an approximate per-worker prefix tree
built from the router's own decisions, `fleet/prefix_router.py`); `kv`
(on `kvpool.index.PrefixIndex` fed by the workers' events: Dynamo's cost by
default, SGLang's rule as the `kv:sglang` variant, `fleet/kv_router.py`).
Sources of every constant: docs/fleet.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvpool.fleet.load import RouteRequest, RouterError, WorkerLoads


def lowest(costs: Sequence[float]) -> int:
    """Index of the smallest cost; the lowest index among ties."""
    return min(range(len(costs)), key=costs.__getitem__)


@dataclass(frozen=True)
class CacheAware:
    """SGLang's cache-aware rule (sgl-router `policies/cache_aware.rs`), its
    defaults those of `sglang_router.launch_router` (`router_args.py`:
    `cache_threshold 0.3`, `balance_abs_threshold 64`, `balance_rel_threshold
    1.5`). Loads are requests in flight per worker."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise RouterError(f"cache_threshold is a fraction in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 0:
            raise RouterError("balance thresholds must not be negative")

    def imbalanced(self, loads: Sequence[int]) -> bool:
        """Both: max - min > abs threshold, and max > min x rel threshold."""
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def choose(self, loads: Sequence[int], matched: Sequence[int], prompt: int, sizes: Sequence[int]) -> int:
        """The worker for a prompt of `prompt` tokens of which worker w is
        believed to hold `matched[w]`, `sizes[w]` its cache's size: the least
        loaded when loads are imbalanced; else the best match when its share of
        the prompt is above the threshold; else the smallest cache."""
        if self.imbalanced(loads):
            return lowest(loads)
        best = lowest([-m for m in matched])
        if prompt and matched[best] / prompt > self.cache_threshold:
            return best
        return lowest(sizes)


class Router(ABC):
    """Picks a worker for each request (module docstring: side effects,
    determinism, ties). Subclasses implement `choose` (no side effects) and
    may extend `record` (the side effects of a decision)."""

    name: ClassVar[str]
    # whether a choice depends on what the workers did (finishes, events); a fleet
    # need not advance its replicas to route for a router that reads nothing
    reads_workers: ClassVar[bool] = True

    def __init__(self, workers: int) -> None:
        self.loads = WorkerLoads(workers)

    @property
    def workers(self) -> int:
        return self.loads.workers

    @abstractmethod
    def choose(self, request: RouteRequest, now: float) -> int:
        """The worker `request` would go to now; changes nothing."""

    def record(self, worker: int, request: RouteRequest, now: float) -> None:
        """Book `request` on `worker` (its load)."""
        self.loads.add(worker, request.request_id)

    def advance(self, now: float) -> None:  # noqa: B027 (a hook: most routers do not change with time)
        """Bring the router's state to time `now` (nothing, unless it changes with time)."""

    def route(self, request: RouteRequest, now: float = 0.0) -> int:
        """Bring the router to `now`, choose a worker for `request` and book it
        there; returns the worker."""
        if request.request_id in self.loads.inflight:
            raise RouterError(f"request {request.request_id!r} is already in flight")
        self.advance(now)
        worker = self.choose(request, now)
        self.record(worker, request, now)
        return worker

    def prefilled(self, request_id: Hashable, now: float = 0.0) -> None:
        """The request's first token is out: its prompt no longer loads its worker's prefill."""
        self.loads.prefilled(request_id)

    def finished(self, request_id: Hashable, now: float = 0.0) -> None:
        """The request is done: its load leaves its worker."""
        self.loads.finished(request_id)

    def observe(self, worker: int, events: Iterable[Any], now: float = 0.0) -> None:
        """`worker`'s KV events emitted at `now` (ignored unless the router reads them)."""
        self.check_worker(worker)

    def check_worker(self, worker: int) -> None:
        if type(worker) is not int or not 0 <= worker < self.workers:
            raise RouterError(f"worker {worker!r} is not one of 0..{self.workers - 1}")


class RoundRobin(Router):
    """Workers in turn, 0, 1, ..., n-1, 0, ... (one counter; finished requests do not matter)."""

    name = "round-robin"
    reads_workers = False

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.turn = 0

    def choose(self, request: RouteRequest, now: float) -> int:
        return self.turn % self.workers

    def record(self, worker: int, request: RouteRequest, now: float) -> None:
        super().record(worker, request, now)
        self.turn += 1


class LeastLoad(Router):
    """The worker with the fewest requests in flight (SGLang's shortest-queue
    fallback, as a policy of its own)."""

    name = "least-load"

    def choose(self, request: RouteRequest, now: float) -> int:
        return lowest(self.loads.requests)
