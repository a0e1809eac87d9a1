"""fleet: what a fleet of replicas adds to one replica's simulation: routers
that pick a replica for each request, the prefill -> decode handoff (bytes
per group, time over a link), the loop that runs replicas behind routers, and
what a fleet's run measured. See docs/fleet.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# `handoff` is both a module and its function: bound here, as the function, once
# (a lazy name would lose to the module the import system binds on first load)
from kvpool.fleet.handoff import (
    GroupHandoff,
    Handoff,
    HandoffError,
    bytes_per_token,
    handoff,
    handoff_link,
    handoff_seconds,
)

if TYPE_CHECKING:
    from kvpool.fleet.kv_router import KvCost, KvRouter
    from kvpool.fleet.load import RouteRequest, RouterError, WorkerLoads
    from kvpool.fleet.loop import FleetReplica, Handoffs, Stage, Transfer, run_fleet
    from kvpool.fleet.metrics import FleetRecord, FleetResult, ReplicaSummary, Slo, SloError
    from kvpool.fleet.prefix_router import ApproxTree, PrefixRouter
    from kvpool.fleet.registry import ROUTER_NAMES, ROUTERS, make_router
    from kvpool.fleet.routers import CacheAware, LeastLoad, RoundRobin, Router

# Each name loads its own module on first use: a single replica's run (and the
# CLI's router names, `kvpool.fleet.registry`) need not load the fleet loop.
_WHERE = {
    "KvCost": "kvpool.fleet.kv_router",
    "KvRouter": "kvpool.fleet.kv_router",
    "RouteRequest": "kvpool.fleet.load",
    "RouterError": "kvpool.fleet.load",
    "WorkerLoads": "kvpool.fleet.load",
    "FleetReplica": "kvpool.fleet.loop",
    "Handoffs": "kvpool.fleet.loop",
    "Stage": "kvpool.fleet.loop",
    "Transfer": "kvpool.fleet.loop",
    "run_fleet": "kvpool.fleet.loop",
    "FleetRecord": "kvpool.fleet.metrics",
    "FleetResult": "kvpool.fleet.metrics",
    "ReplicaSummary": "kvpool.fleet.metrics",
    "Slo": "kvpool.fleet.metrics",
    "SloError": "kvpool.fleet.metrics",
    "ApproxTree": "kvpool.fleet.prefix_router",
    "PrefixRouter": "kvpool.fleet.prefix_router",
    "ROUTER_NAMES": "kvpool.fleet.registry",
    "ROUTERS": "kvpool.fleet.registry",
    "make_router": "kvpool.fleet.registry",
    "CacheAware": "kvpool.fleet.routers",
    "LeastLoad": "kvpool.fleet.routers",
    "RoundRobin": "kvpool.fleet.routers",
    "Router": "kvpool.fleet.routers",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ROUTERS",
    "ROUTER_NAMES",
    "ApproxTree",
    "CacheAware",
    "FleetRecord",
    "FleetReplica",
    "FleetResult",
    "GroupHandoff",
    "Handoff",
    "HandoffError",
    "Handoffs",
    "KvCost",
    "KvRouter",
    "LeastLoad",
    "PrefixRouter",
    "ReplicaSummary",
    "RoundRobin",
    "RouteRequest",
    "Router",
    "RouterError",
    "Slo",
    "SloError",
    "Stage",
    "Transfer",
    "WorkerLoads",
    "bytes_per_token",
    "handoff",
    "handoff_link",
    "handoff_seconds",
    "make_router",
    "run_fleet",
]
