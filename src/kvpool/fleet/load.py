"""What a router knows of its workers: the requests it sent them that have not
finished, as Dynamo's and SGLang's routers track it from their own decisions
(neither asks the workers): per worker the requests in flight, the prompt
tokens still to prefill, and the distinct prompt blocks the requests in flight
hold. And the request a router sees."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvpool.cache.hashing import Salt, published_scope
from kvpool.errors import KvpoolError
from kvpool.index.prefix_index import chain_keys, scope_root


class RouterError(KvpoolError, ValueError):
    """A router used wrongly: an unknown router or variant, a bad parameter,
    a request id routed twice or never routed, a worker out of range."""


@dataclass(frozen=True)
class RouteRequest:
    """A request as a router sees it: its id, its prompt's token ids, its
    reuse scope (a kvpool salt; None for the shared scope)."""

    request_id: Hashable
    token_ids: Sequence[int]
    salt: Salt = None

    def block_keys(self, block_size: int) -> list[int]:
        """The chained keys of the prompt's whole blocks, as `kvpool.index`
        keys them (so a router's own records and the index agree)."""
        return chain_keys(self.token_ids, block_size, scope_root(*published_scope(self.salt)))


@dataclass
class InFlight:
    """One routed request that has not finished."""

    worker: int
    prefill_tokens: int
    blocks: tuple[int, ...]


@dataclass
class WorkerLoads:
    """Per worker: `requests` in flight, `prefill_tokens` not yet prefilled,
    and the distinct prompt `blocks` (refcounted keys) of its requests in
    flight. Side effects only through `add`, `prefilled` and `finished`."""

    workers: int
    requests: list[int] = field(init=False)
    prefill_tokens: list[int] = field(init=False)
    blocks: list[Counter[int]] = field(init=False)
    inflight: dict[Hashable, InFlight] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.workers) is not int or self.workers < 1:
            raise RouterError(f"a router needs at least one worker, got {self.workers!r}")
        self.requests = [0] * self.workers
        self.prefill_tokens = [0] * self.workers
        self.blocks = [Counter() for _ in range(self.workers)]

    def add(self, worker: int, request_id: Hashable, prefill_tokens: int = 0, blocks: Sequence[int] = ()) -> None:
        """`request_id` is now in flight on `worker`; RouterError if it already is."""
        if request_id in self.inflight:
            raise RouterError(
                f"request {request_id!r} is already in flight on worker {self.inflight[request_id].worker}"
            )
        self.inflight[request_id] = InFlight(worker, prefill_tokens, tuple(blocks))
        self.requests[worker] += 1
        self.prefill_tokens[worker] += prefill_tokens
        self.blocks[worker].update(blocks)

    def prefilled(self, request_id: Hashable) -> None:
        """`request_id`'s prompt is computed (its first token is out): its
        tokens no longer wait for prefill."""
        r = self._get(request_id)
        self.prefill_tokens[r.worker] -= r.prefill_tokens
        r.prefill_tokens = 0

    def finished(self, request_id: Hashable) -> int:
        """`request_id` is done (or cancelled): its load leaves its worker,
        which is returned."""
        self.prefilled(request_id)
        r = self.inflight.pop(request_id)
        self.requests[r.worker] -= 1
        self.blocks[r.worker].subtract(r.blocks)
        for key in r.blocks:
            if self.blocks[r.worker][key] <= 0:
                del self.blocks[r.worker][key]
        return r.worker

    def blocks_with(self, worker: int, blocks: Sequence[int]) -> int:
        """Distinct blocks `worker` would hold in flight with `blocks` added
        (Dynamo's potential decode blocks)."""
        held = self.blocks[worker]
        return len(held) + len({b for b in blocks if b not in held})

    def _get(self, request_id: Hashable) -> InFlight:
        try:
            return self.inflight[request_id]
        except KeyError:
            raise RouterError(f"request {request_id!r} is not in flight (never routed, or already finished)") from None
