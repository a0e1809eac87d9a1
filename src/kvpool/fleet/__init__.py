"""fleet: what a fleet of replicas adds to one replica's simulation: routers
that pick a replica for each request, the prefill -> decode handoff (bytes
per group, time over a link), the loop that runs replicas behind routers, and
what a fleet's run measured. See docs/fleet.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from kvpool.lazy import lazy_names

if TYPE_CHECKING:
    from kvpool.fleet.kv_router import KvCost, KvRouter
    from kvpool.fleet.load import RouteRequest, RouterError, WorkerLoads
    from kvpool.fleet.loop import FleetReplica, Handoffs, Stage, Transfer, run_fleet
    from kvpool.fleet.metrics import FleetRecord, FleetResult, ReplicaSummary, Slo, SloError
    from kvpool.fleet.prefix_router import ApproxTree, PrefixRouter
    from kvpool.fleet.registry import ROUTERS, make_router
    from kvpool.fleet.router_names import ROUTER_NAMES
    from kvpool.fleet.routers import CacheAware, LeastLoad, RoundRobin, Router

# Each name loads its own module on first use: a single replica's run (and the
# CLI's router names, `kvpool.fleet.router_names`) need not load the fleet loop.
__getattr__ = lazy_names(
    __name__,
    {
        "kvpool.fleet.kv_router": ("KvCost", "KvRouter"),
        "kvpool.fleet.load": ("RouteRequest", "RouterError", "WorkerLoads"),
        "kvpool.fleet.loop": ("FleetReplica", "Handoffs", "Stage", "Transfer", "run_fleet"),
        "kvpool.fleet.metrics": ("FleetRecord", "FleetResult", "ReplicaSummary", "Slo", "SloError"),
        "kvpool.fleet.prefix_router": ("ApproxTree", "PrefixRouter"),
        "kvpool.fleet.registry": ("ROUTERS", "make_router"),
        "kvpool.fleet.router_names": ("ROUTER_NAMES",),
        "kvpool.fleet.routers": ("CacheAware", "LeastLoad", "RoundRobin", "Router"),
    },
)


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
