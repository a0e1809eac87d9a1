"""sim: replay request traces against a plan through the shared scheduler and
the real `KVCacheManager`, with a documented step-time model (`steptime`).
NumPy only; matplotlib is imported lazily for plots."""

from kvpool.sim.metrics import GroupUsage, SimResult
from kvpool.sim.simulator import Progress, simulate
from kvpool.sim.steptime import StepTimeModel, Weights, load_weights

__all__ = ["GroupUsage", "Progress", "SimResult", "StepTimeModel", "Weights", "load_weights", "simulate"]
