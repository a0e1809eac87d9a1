"""One rank's step-time model for a simulation: the weight bytes a rank holds
(given, or the bundled model's, at the memory budget's share or split over the
tensor-parallel ranks) and the kernel constants (`calibration`). `simulate`
and `calibrate` build their step times from it (`sim.steptime.StepTimeModel`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvpool.deploy.options import PlanRequest
from kvpool.deploy.resolution import Resolved, load_spec
from kvpool.errors import KvpoolError, flagged
from kvpool.presets import GpuSpec
from kvpool.sim import StepTimeModel, Weights, load_weights
from kvpool.sim.calibration import load_profile
from kvpool.sim.kernels import Calibration
from kvpool.units import format_bytes, parse_size


def per_rank(weights: Weights, share: float) -> Weights:
    """`weights` scaled to one rank's `share` of the bytes (total and active alike)."""
    return dataclasses.replace(
        weights, total_params=weights.total_params * share, active_params=weights.active_params * share
    )


def calibration_of(value: Calibration | str | Path | None) -> Calibration | str | None:
    """None (the GPU's shipped profile), 'roofline', a profile, or the file of one."""
    if value is None or isinstance(value, Calibration) or value == "roofline":
        return value
    with flagged("--calibration"):
        return load_profile(value)


def step_weights(
    model: str, resolved: Resolved, weights: Weights | None, total: int | None, active: float | None
) -> Weights:
    """One rank's weights for the step times: `weights` or the model's (`total`
    bytes, `active` parameters when given), at the budget's share when it has one."""
    if weights is None:
        weights = load_weights(model, weights_bytes=total, active_params=active)
    memory = resolved.budget.memory
    if memory is not None:
        return per_rank(weights, memory.weights_bytes / (weights.total_params * weights.bytes_per_param))
    tp = resolved.request.model.tp
    return per_rank(weights, 1 / tp) if tp > 1 else weights


def rank_step_model(request: PlanRequest, gpu: GpuSpec, calibration: Calibration | str | None) -> StepTimeModel:
    """The step-time model of one rank of the request's model at its tp (the
    bundled weights split evenly, no budget), at the constants `calibration`."""
    spec, _ = load_spec(request.model, request.limits.max_seq_len)
    return StepTimeModel.build(
        spec, gpu, per_rank(load_weights(request.model.model), 1 / request.model.tp), calibration
    )


def weights_total(weights: Weights | None, weights_bytes: int | str | None, active: float | None) -> int | None:
    """The model's weight bytes on all ranks, when given (`weights` or `weights_bytes`)."""
    if weights is not None and (weights_bytes is not None or active is not None):
        raise KvpoolError("weights says the bytes and active parameters: drop --weights-bytes / --active-params")
    if weights is not None:
        return int(weights.total_params * weights.bytes_per_param)
    with flagged("--weights-bytes"):
        return None if weights_bytes is None else parse_size(weights_bytes)


def rank_weights(total: int | None, text: int | str | None, tp: int, gpu: GpuSpec) -> int | None:
    """One rank's share of the `total` weight bytes over `tp`, refused when one
    `gpu` cannot hold it (a typo, and the budget would be negative)."""
    if total is None:
        return None
    given = -(-total // tp)
    if given > gpu.memory_bytes:
        raise KvpoolError(
            f"--weights-bytes {text if text is not None else total} over --tp {tp} is more than one {gpu.key} holds "
            f"({format_bytes(gpu.memory_bytes)}); give the checkpoint's size, or more --tp"
        )
    return given
