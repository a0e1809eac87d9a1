"""Factories for the fleet tests: replicas whose cache is a real
`KVCacheManager` that serves a prompt at once (its pages cached when it
finishes), feeding a router its KV events as a fleet would."""

from __future__ import annotations

from collections.abc import Sequence

from cache_helpers import full_spec
from kvpool.cache import KVCacheManager
from kvpool.cache.kv_wire import wire_events
from kvpool.fleet import Router, RouteRequest
from kvpool.plan import PoolPlan, ServingLimits

TPB = 4


class Replica:
    """One worker: a manager of `pages` pages of `TPB` tokens (full attention)."""

    def __init__(self, pages: int = 64) -> None:
        plan = PoolPlan.from_pages(
            full_spec(tpb=TPB), {"full": pages}, ServingLimits(max_batch_size=8, max_seq_len=512)
        )
        self.m = KVCacheManager(plan)

    def serve(self, rid: int, prompt: Sequence[int]) -> int:
        """Compute `prompt` (its cached prefix reused) and finish; returns the tokens reused."""
        hit = self.m.cached_prefix(prompt).gpu
        self.m.create(rid, list(prompt))
        assert self.m.resize(rid, len(prompt), len(prompt))
        self.m.commit(rid, len(prompt))
        self.m.free(rid)
        return hit

    def events(self) -> list[object]:
        return list(wire_events(self.m.take_events(), self.m.groups))


def serve_through(router: Router, replicas: list[Replica], prompts: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Route each prompt, serve it on the chosen replica at once, hand the
    router that replica's events; the choices and the prompt tokens reused."""
    choices, reused = [], 0
    for rid, prompt in enumerate(prompts):
        w = router.route(RouteRequest(rid, prompt), float(rid))
        reused += replicas[w].serve(rid, prompt)
        router.prefilled(rid, float(rid))
        router.finished(rid, float(rid))
        router.observe(w, replicas[w].events(), float(rid))
        choices.append(w)
    return choices, reused
