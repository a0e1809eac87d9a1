"""What one kind of GPU work costs, given a GPU and its calibration constants.

Each cost is a floor (what the kernel costs however small its input) plus its
work over an efficiency-scaled peak. The constants are fitted on measured
kernel timings (`sim/calibration.py`, data/calibration.json); each form below
was chosen because it fits those timings (docs/sim.md, "The step-time model"):

- **matmul** (tokens x k) @ (k x n): floor + soft-max(F / (eta_F x peak),
  B / (eta_B x HBM)) with F = 2 T k n and B = k n x bytes/param + 2 T (k + n).
  The soft maximum (a^p + b^p)^(1/p) is the roofline with its knee rounded:
  around the ridge point neither the math nor the weight stream runs at its
  own peak. On Vidur's A100/H100 profiles p ~ 1.5 fits best (docs/sim.md).
- **decode attention**: per layer a floor, plus the KV bytes read over
  eta x HBM (FlashInfer/FlashAttention decode is bandwidth bound).
- **prefill attention**: per layer a floor, plus the (query, key) pair FLOPs
  over eta x the BF16 peak (attention math runs in BF16 whatever the weights);
  where vLLM runs the prefill on its Triton backend (`sim/triton_prefill.py`),
  no faster than the L2 feeds that kernel's small tiles their keys.
- **elementwise** (norms, RoPE, activation, residual adds): per layer a floor
  plus `elementwise_bytes` x tokens x hidden over HBM (the bytes and the
  bandwidth share cannot be told apart from timings: one fitted constant).
- **tensor-parallel all-reduce** (two per layer): the faster of a one-shot
  custom all-reduce (latency + bytes / small-message bandwidth) and NCCL's
  bandwidth-bound ring (2 (n - 1) / n x bytes over bus bandwidth).

All functions take floats or NumPy arrays (the simulator prices a run of
decode steps at once).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.errors import KvpoolError
from kvpool.sim.fp4_experts import Fp4Experts, expected_blocks
from kvpool.sim.matmuls import Gemm
from kvpool.sim.triton_prefill import TritonPrefill

Num = Any  # a float, or a NumPy array of them (a run of steps priced at once)


def _check_constant(name: str, v: object) -> None:
    """A calibration constant: a finite number >= 0 (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise CalibrationError(f"calibration constant {name} must be a finite number >= 0, got {v!r}")


class CalibrationError(KvpoolError):
    """A calibration profile is malformed (missing or non-positive constant)."""


# The shares of a GPU's peak the kernels reach: none can be above 1.
EFFICIENCIES = ("linear_flops_eff", "linear_bw_eff", "decode_attn_bw_eff", "prefill_attn_flops_eff")


@dataclass(frozen=True)
class Calibration:
    """The step-time model's constants for one GPU (seconds, shares of peak)."""

    name: str
    linear_flops_eff: float  # share of peak FLOPS large matmuls reach
    linear_bw_eff: float  # share of HBM bandwidth a weight-streaming matmul reaches
    linear_blend: float  # p of the soft maximum (1 = sum of the two times)
    linear_floor_s: float  # per matmul kernel
    elementwise_bytes: float  # per layer, norms/RoPE/act/adds: bytes at peak bandwidth per token x hidden
    elementwise_floor_s: float  # per layer
    decode_attn_bw_eff: float
    decode_attn_floor_s: float  # per layer
    prefill_attn_flops_eff: float
    prefill_attn_floor_s: float  # per layer
    allreduce_latency_s: float
    allreduce_small_bytes_per_s: float  # one-shot custom all-reduce, message bytes / s
    allreduce_bus_bytes_per_s: float  # NCCL ring bus bandwidth
    moe_floor_s: float  # per MoE layer: router, top-k, token permute / un-permute
    moe_tile: int  # rows an expert's grouped-matmul tile holds: a touched expert pays whole tiles
    step_floor_s: float  # engine CPU time per step not hidden behind the GPU (schedule, inputs, sampling)
    row_s: float  # engine CPU time per request in the step
    launch_s: float  # one eager kernel launch (CPU)
    source: str = ""

    def __post_init__(self) -> None:
        """Every constant a finite number >= 0, the efficiencies and the blend > 0,
        and no efficiency above 1: a fit faster than the GPU's peak measured
        another GPU (or another --tp), and would price every step as impossible."""
        for f in dataclasses.fields(self):
            if f.name not in ("name", "source"):
                _check_constant(f.name, getattr(self, f.name))
        if not isinstance(self.moe_tile, int):
            raise CalibrationError(
                f"calibration constant moe_tile must be a whole number of rows, got {self.moe_tile!r}"
            )
        for key in ("linear_flops_eff", "linear_bw_eff", "linear_blend", "moe_tile"):
            if getattr(self, key) <= 0:
                raise CalibrationError(f"calibration constant {key} must be > 0, got {getattr(self, key)!r}")
        over = {k: getattr(self, k) for k in EFFICIENCIES if getattr(self, k) > 1}
        if over:
            shares = ", ".join(f"{k} {v:.3g}" for k, v in over.items())
            raise CalibrationError(
                f"calibration constant(s) {shares}, above 1: faster than the GPU's peak allows; check --gpu, --tp "
                "and MODEL, and that the times are milliseconds under 'ms' (seconds under 'seconds')"
            )

    @classmethod
    def from_json(cls, data: dict[str, Any], name: str | None = None) -> Calibration:
        """A profile from its JSON object; CalibrationError names what is wrong."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"name", "source"}
        missing = sorted(fields - set(data))
        if missing:
            raise CalibrationError(f"calibration profile lacks {', '.join(missing)}")
        values = {key: data[key] for key in fields}
        tile = values["moe_tile"]
        if isinstance(tile, float) and tile.is_integer():  # JSON may spell the count 8.0
            values["moe_tile"] = int(tile)
        return cls(name=str(name or data.get("name") or "custom"), source=str(data.get("source", "")), **values)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def maximum(a: Num, b: Num) -> Num:
    """`np.maximum(a, b)`; of two floats (one step, never NaN) the same value
    without NumPy, whose ufunc call on scalars costs more than the rest of a
    step's arithmetic."""
    if type(a) is float and type(b) is float:
        return a if a >= b else b
    return np.maximum(a, b)


def minimum(a: Num, b: Num) -> Num:
    """`np.minimum(a, b)`, of two floats without NumPy (`maximum`)."""
    if type(a) is float and type(b) is float:
        return a if a <= b else b
    return np.minimum(a, b)


def soft_max(a: Num, b: Num, p: float) -> Num:
    """(a^p + b^p)^(1/p): between a + b (p = 1) and max(a, b) (p -> inf)."""
    if p == 1.0:
        return a + b
    out: Num = (a**p + b**p) ** (1.0 / p)
    return out


@dataclass(frozen=True)
class Kernels:
    """Costs on one GPU: peaks (bytes/s, FLOP/s) and the calibration."""

    cal: Calibration
    hbm: float
    matmul_flops: float  # the peak the weights' matmuls run at (BF16, or FP8 for 1-byte weights)
    attention_flops: float  # BF16 peak
    fp4: Fp4Experts | None = None  # the kernel of 4-bit experts on this GPU (sim/fp4_experts.py); None: generic
    triton: TritonPrefill | None = None  # vLLM's Triton prefill attention (sim/triton_prefill.py); None: calibrated

    def matmul(self, tokens: Num, g: Gemm, bytes_per_param: float) -> Num:
        """`g.count` multiplies of `tokens` rows."""
        c = self.cal
        flops = 2.0 * tokens * g.k * g.n
        moved = g.k * g.n * bytes_per_param + 2.0 * tokens * (g.k + g.n)
        one = soft_max(
            flops / (c.linear_flops_eff * self.matmul_flops), moved / (c.linear_bw_eff * self.hbm), c.linear_blend
        )
        return g.count * (c.linear_floor_s + one)

    def experts(
        self, tokens: float, gemms: tuple[Gemm, ...], touched: float, bytes_per_param: float, top_k: int, experts: int
    ) -> Num:
        """One MoE layer's routed experts (`experts` of them) for `tokens`
        tokens: `touched` experts each stream their weights; the math runs in
        whole `moe_tile`-row tiles of the (expected) tokens each touched expert
        gets. 4-bit experts on a GPU with an `fp4` kernel run as that kernel
        does: its blocks of rows, as many as the experts' binomial row counts
        pad to (each streams the expert's weights again), at its MMA's share
        of the peak (sim/fp4_experts.py)."""
        c = self.cal
        per_expert = tokens * top_k / max(touched, 1e-9)
        fp4 = self.fp4 if bytes_per_param < 1 else None
        flops_peak = c.linear_flops_eff * self.matmul_flops
        if fp4 is None:
            rows, streams = float(math.ceil(per_expert / c.moe_tile) * c.moe_tile), 1.0
        else:
            block = fp4.block_rows(tokens, top_k, experts)
            streams = expected_blocks(round(float(tokens)), top_k, experts, block) / max(touched, 1e-9)
            rows, flops_peak = streams * block, flops_peak * fp4.mma_share
        total: Num = c.moe_floor_s
        for g in gemms:
            flops = 2.0 * touched * rows * g.k * g.n
            moved = touched * streams * g.k * g.n * bytes_per_param + 2.0 * tokens * top_k * (g.k + g.n)
            t = soft_max(flops / flops_peak, moved / (c.linear_bw_eff * self.hbm), c.linear_blend)
            total = total + g.count * (c.linear_floor_s + t)
        return total

    def decode_attention(self, kv_bytes: Num, flops: Num, layers: int) -> Num:
        """Attention of decode rows over `kv_bytes` of keys and values in `layers` layers."""
        c = self.cal
        work = maximum(
            kv_bytes / (c.decode_attn_bw_eff * self.hbm), flops / (c.prefill_attn_flops_eff * self.attention_flops)
        )
        return layers * c.decode_attn_floor_s + work

    def prefill_attention(self, flops: Num, layers: int) -> Num:
        c = self.cal
        work = flops / (c.prefill_attn_flops_eff * self.attention_flops)
        if self.triton is not None:
            work = maximum(work, flops / self.triton.flops_per_s)
        return layers * c.prefill_attn_floor_s + work

    def elementwise(self, tokens: Num, hidden: int, layers: int) -> Num:
        c = self.cal
        return layers * (c.elementwise_floor_s + c.elementwise_bytes * tokens * hidden / self.hbm)

    def allreduce(self, tokens: Num, hidden: int, ranks: int, count: int) -> Num:
        """`count` all-reduces of a tokens x hidden BF16 activation over `ranks` ranks."""
        if ranks <= 1:
            return 0.0 * tokens
        c = self.cal
        size = 2.0 * tokens * hidden
        one_shot = c.allreduce_latency_s + size / c.allreduce_small_bytes_per_s
        ring = c.allreduce_latency_s + 2.0 * (ranks - 1) / ranks * size / c.allreduce_bus_bytes_per_s
        return count * minimum(one_shot, ring)
