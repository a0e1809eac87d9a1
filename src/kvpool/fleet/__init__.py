"""fleet: what a fleet of replicas adds to one replica's simulation: routers
that pick a replica for each request, and the prefill -> decode handoff
(bytes per group, time over a link). See docs/fleet.md."""

from kvpool.fleet.handoff import (
    GroupHandoff,
    Handoff,
    HandoffError,
    bytes_per_token,
    handoff,
    handoff_link,
    handoff_seconds,
)

__all__ = [
    "GroupHandoff",
    "Handoff",
    "HandoffError",
    "bytes_per_token",
    "handoff",
    "handoff_link",
    "handoff_seconds",
]
