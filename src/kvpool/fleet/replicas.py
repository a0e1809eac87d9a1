"""A fleet's replicas: `kvpool.sim.Replica`s of one plan, a decode replica
with the decode side's step times (`fleet.steps.DecodeSteps`)."""

from __future__ import annotations

from kvpool.fleet.loop import FleetReplica
from kvpool.fleet.steps import DecodeSteps
from kvpool.plan import PoolPlan
from kvpool.sim.steptime import StepTimeModel


def make_replica(plan: PoolPlan, model: StepTimeModel, role: str, name: str, events: bool) -> FleetReplica:
    """One replica of `plan` in a stage of `role`, named `name`, emitting KV events when `events`."""
    steps = DecodeSteps.of(model) if role == "decode" else model
    raise NotImplementedError(f"waiting for kvpool.sim.Replica ({name}, {steps.calibration}, {plan.policy}, {events})")
