"""sim: replay request traces against a plan through the shared scheduler and
the real `KVCacheManager`, with a documented step-time model (`steptime`).
NumPy only; matplotlib is imported lazily for plots."""

from kvpool.sim.metrics import GroupUsage, RequestRecord, SimResult
from kvpool.sim.replica import Progress, Replica, ReplicaLoad
from kvpool.sim.replica_spec import ReplicaSpec
from kvpool.sim.requests import TraceRequest
from kvpool.sim.simulator import replay, simulate
from kvpool.sim.steptime import StepTimeModel, Weights, load_weights

__all__ = [
    "GroupUsage",
    "Progress",
    "Replica",
    "ReplicaLoad",
    "ReplicaSpec",
    "RequestRecord",
    "SimResult",
    "StepTimeModel",
    "TraceRequest",
    "Weights",
    "load_weights",
    "replay",
    "simulate",
]
