"""The step-time model's constants: the shipped profiles, a user's own, and
the fits that produce both.

Shipped profiles (`presets/data/calibration.json`) are fitted by
`benchmarks/fit_calibration.py` on Vidur's measured kernel timings (A100 80GB
and H100, MIT licence: `presets/data/VIDUR-LICENSE`); each constant names its
source there. A GPU without a profile of its own borrows the efficiencies of
the nearest one (`for_gpu`: Ampere parts the A100's, the rest the H100's),
which the profile's name says ("h100 (for l40s)").

`kvpool calibrate` refits a profile from a user's measurements: matmul
timings in Vidur's `mlp.csv` layout (`fit_matmul`, `fit_affine`), or whole
step times (`fit_steps`: one factor on every efficiency, the per-step floor
and the per-request CPU time).

Every fit minimises the squared *relative* error, so short kernels count as
much as long ones; it needs only NumPy (a grid over the two efficiencies and
the blend, least squares for the rest).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvpool import jsonsafe
from kvpool.presets import DATA, GpuSpec
from kvpool.sim.kernels import Calibration, CalibrationError, soft_max

Array = npt.NDArray[np.float64]
AMPERE = ("a100", "a10", "a30", "a40", "a6000")
# Vidur's profiler layout (mlp.csv): per row one model shape at one token count and TP,
# the median milliseconds of each operation of a layer.
VIDUR_MATMULS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_ELEMENTWISE = {"input_layernorm": 1, "post_attention_layernorm": 1, "attn_rope": 1, "mlp_act": 1, "add": 2}
VIDUR_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers")
VIDUR_COLUMNS = (*VIDUR_SHAPE, "use_gated_mlp", *(f"time_stats.{op}.median" for op in VIDUR_MATMULS))
BLENDS = (1.0, 1.25, 1.5, 2.0, 3.0)


@cache
def shipped() -> dict[str, Calibration]:
    """The bundled profiles by name (data/calibration.json)."""
    raw: dict[str, Any] = json.loads((DATA / "calibration.json").read_text())["profiles"]
    return {name: Calibration.from_json(body, name) for name, body in raw.items()}


def for_gpu(gpu: GpuSpec) -> Calibration:
    """The shipped profile of `gpu`, or the nearest one's, renamed to say so."""
    profiles = shipped()
    key = gpu.key.lower()
    if key in profiles:
        return profiles[key]
    base = "a100" if key.startswith(AMPERE) else "h100"
    return dataclasses.replace(profiles[base], name=f"{base} (for {gpu.key})")


def load_profile(path: str | Path) -> Calibration:
    """A profile `kvpool calibrate` wrote. CalibrationError on anything else."""
    p = Path(path).expanduser()
    try:
        data = jsonsafe.loads(p.read_bytes(), constants=True)  # a NaN constant is refused by name (Calibration)
    except OSError as e:
        raise CalibrationError(f"cannot read calibration {p}: {e.strerror or e}") from None
    except jsonsafe.JSONValueError as e:
        raise CalibrationError(
            f"calibration {p} is not JSON kvpool reads ({e}); write one with `kvpool calibrate`"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("calibration"), dict):
        raise CalibrationError(f"calibration {p} has no 'calibration' object; write one with `kvpool calibrate`")
    return Calibration.from_json(data["calibration"], str(data["calibration"].get("name") or p.stem))


def profile_json(cal: Calibration, *, report: dict[str, Any]) -> str:
    """The profile file `load_profile` reads: `cal` and its fit report as JSON,
    never with Infinity or NaN in it (CalibrationError)."""
    try:
        return json.dumps({"calibration": cal.to_json(), "fit": report}, indent=2, allow_nan=False) + "\n"
    except ValueError:  # Calibration refuses non-finite constants; this is the report's
        raise CalibrationError(
            "the fit's report holds a non-finite number: the measurements cannot be fitted"
        ) from None


@dataclass(frozen=True)
class OpSamples:
    """Kernel timings as the fits read them: matmuls (tokens, k, n, seconds) and
    elementwise layers (tokens x hidden, seconds)."""

    tokens: Array
    k: Array
    n: Array
    seconds: Array
    elementwise_x: Array
    elementwise_s: Array


def vidur_samples(rows: Iterable[Mapping[str, str]]) -> OpSamples:
    """The samples of rows in Vidur's mlp.csv layout: the four multiplies per
    rank as Vidur sharded them (QKV and gate/up split by output, O and down by
    input), and the layer's norms, RoPE, activation and two residual adds.
    CalibrationError names the row (from 1) and column of a bad value."""
    tok: list[float] = []
    ks: list[float] = []
    ns: list[float] = []
    t: list[float] = []
    ex: list[float] = []
    et: list[float] = []
    for i, r in enumerate(rows, start=1):
        h, inter, heads, kv, n_tok, tp = (
            int(_vidur_number(r, i, c, 1))
            for c in ("n_embd", "n_expanded_embd", "n_head", "n_kv_head", "num_tokens", "num_tensor_parallel_workers")
        )
        d, up = h // heads, (2 if r.get("use_gated_mlp") == "True" else 1) * inter
        shapes = ((h, (heads + 2 * kv) * d // tp), (heads * d // tp, h), (h, up // tp), (inter // tp, h))
        for op, (k, n) in zip(VIDUR_MATMULS, shapes, strict=True):
            tok.append(n_tok)
            ks.append(k)
            ns.append(n)
            t.append(_vidur_number(r, i, f"time_stats.{op}.median") * 1e-3)
        if all(f"time_stats.{op}.median" in r for op in VIDUR_ELEMENTWISE):
            ex.append(n_tok * h)
            et.append(
                sum(w * _vidur_number(r, i, f"time_stats.{op}.median") for op, w in VIDUR_ELEMENTWISE.items()) * 1e-3
            )
    if not t:
        raise CalibrationError("no timings to fit")
    a = [np.asarray(x, dtype=np.float64) for x in (tok, ks, ns, t, ex, et)]
    return OpSamples(*a)


def _vidur_number(row: Mapping[str, str], i: int, key: str, low: float = 0.0) -> float:
    try:
        v = float(row[key])
    except (KeyError, TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or v < low:
        raise CalibrationError(f"row {i}: {key} must be a number >= {low:g}, got {row.get(key)!r}")
    return v


def matmul_seconds(
    v: Mapping[str, float], tokens: Array, k: Array, n: Array, *, flops: float, hbm: float, bytes_per_param: float = 2.0
) -> Array:
    """What the matmul constants `v` (linear_*) predict for (tokens x k) @ (k x n)."""
    f = 2.0 * tokens * k * n / flops
    b = (k * n * bytes_per_param + 2.0 * tokens * (k + n)) / hbm
    out: Array = v["linear_floor_s"] + soft_max(f / v["linear_flops_eff"], b / v["linear_bw_eff"], v["linear_blend"])
    return out


def fit_ops(samples: OpSamples, base: Calibration, *, flops: float, hbm: float) -> tuple[Calibration, dict[str, Any]]:
    """`base` with its matmul (and, given elementwise timings, elementwise)
    constants fitted on `samples`, and a report of the fit."""
    mm = fit_matmul(samples.tokens, samples.k, samples.n, samples.seconds, flops=flops, hbm=hbm)
    cal = dataclasses.replace(base, **mm.values)  # type: ignore[arg-type]
    report: dict[str, Any] = {
        "matmul": {**mm.values, "median_error": mm.median_error, "p90_error": mm.p90_error, "samples": mm.samples}
    }
    if len(samples.elementwise_s):
        floor, slope, fit = fit_affine(samples.elementwise_x / hbm, samples.elementwise_s)
        cal = dataclasses.replace(cal, elementwise_floor_s=floor, elementwise_bytes=slope)
        report["elementwise"] = {
            "floor_s": floor,
            "bytes": slope,
            "median_error": fit.median_error,
            "p90_error": fit.p90_error,
            "samples": fit.samples,
        }
    return cal, report


@dataclass(frozen=True)
class Fit:
    """Fitted constants and how well they fit: median and 90th-percentile
    absolute relative error over the samples."""

    values: dict[str, float]
    median_error: float
    p90_error: float
    samples: int


def _errors(pred: Array, t: Array) -> tuple[float, float]:
    e = np.abs(pred / t - 1.0)
    return float(np.median(e)), float(np.quantile(e, 0.9))


def _floor(model: Array, t: Array) -> float:
    """The floor c >= 0 minimising sum(((c + model) / t - 1)^2)."""
    return max(0.0, float(np.sum((1.0 - model / t) / t) / np.sum(1.0 / t**2)))


def fit_matmul(
    tokens: Array, k: Array, n: Array, seconds: Array, *, flops: float, hbm: float, bytes_per_param: float = 2.0
) -> Fit:
    """linear_flops_eff, linear_bw_eff, linear_blend, linear_floor_s from matmul
    timings of (tokens x k) @ (k x n) on a GPU of peak `flops` and `hbm` bytes/s."""
    _check(seconds)
    f = 2.0 * tokens * k * n / flops
    b = (k * n * bytes_per_param + 2.0 * tokens * (k + n)) / hbm
    grid = np.linspace(0.3, 1.0, 71)
    best: tuple[float, ...] | None = None
    for p in BLENDS:
        bp = (b[None, :] / grid[:, None]) ** p  # (eff_b, sample)
        for ef in grid:
            s = ((f / ef) ** p + bp) ** (1.0 / p)
            c = np.maximum(0.0, np.sum((1.0 - s / seconds) / seconds, axis=1) / np.sum(1.0 / seconds**2))
            err = np.sum(((c[:, None] + s) / seconds - 1.0) ** 2, axis=1)
            i = int(np.argmin(err))
            if best is None or err[i] < best[0]:
                best = (float(err[i]), float(ef), float(grid[i]), p, float(c[i]))
    assert best is not None
    _, ef, eb, p, c = best
    pred = c + soft_max(f / ef, b / eb, p)
    med, p90 = _errors(pred, seconds)
    return Fit(
        {"linear_flops_eff": ef, "linear_bw_eff": eb, "linear_blend": p, "linear_floor_s": c}, med, p90, len(seconds)
    )


def fit_affine(x: Array, seconds: Array) -> tuple[float, float, Fit]:
    """(floor, slope) >= 0 of seconds ~ floor + slope x `x`, in relative error."""
    _check(seconds)
    a = np.stack([np.ones_like(x), x], axis=1) / seconds[:, None]
    (floor, slope), *_ = np.linalg.lstsq(a, np.ones_like(seconds), rcond=None)
    if floor < 0:
        floor = 0.0
        slope = float(np.sum(x / seconds) / np.sum((x / seconds) ** 2))
    if slope <= 0:
        raise CalibrationError("the timings do not grow with the work: cannot fit a bandwidth or FLOP rate")
    med, p90 = _errors(floor + slope * x, seconds)
    return float(floor), float(slope), Fit({"floor_s": float(floor), "slope": float(slope)}, med, p90, len(seconds))


@dataclass(frozen=True)
class StepSample:
    """One measured step: its GPU time as the current model prices it (without
    floors), its requests, and the measured seconds."""

    modelled_gpu_s: float
    requests: int
    seconds: float


def fit_steps(base: Calibration, samples: Sequence[StepSample]) -> tuple[Calibration, Fit]:
    """Refit `base` on whole-step timings: seconds ~ gpu / s + floor + row x
    requests, all >= 0. `s` scales every efficiency (the kernels' shape is
    kept, their speed on this machine fitted); floor and row replace
    step_floor_s and row_s."""
    if len(samples) < 3:
        raise CalibrationError(f"need at least 3 measured steps to fit, got {len(samples)}")
    gpu = np.array([s.modelled_gpu_s for s in samples])
    req = np.array([float(s.requests) for s in samples])
    t = np.array([s.seconds for s in samples])
    _check(t)
    cols = [gpu, np.ones_like(t), req] if np.ptp(req) > 0 else [gpu, np.ones_like(t)]
    a = np.stack(cols, axis=1) / t[:, None]
    coef = _nonnegative_lstsq(a, np.ones_like(t))
    if coef[0] <= 0:
        raise CalibrationError("the measured steps do not grow with the modelled work; check the model and GPU given")
    scale = 1.0 / coef[0]
    row = coef[2] if len(coef) > 2 else base.row_s
    cal = dataclasses.replace(
        base,
        name="custom",
        linear_flops_eff=base.linear_flops_eff * scale,
        linear_bw_eff=base.linear_bw_eff * scale,
        decode_attn_bw_eff=base.decode_attn_bw_eff * scale,
        prefill_attn_flops_eff=base.prefill_attn_flops_eff * scale,
        elementwise_bytes=base.elementwise_bytes / scale,
        step_floor_s=float(coef[1]),
        row_s=float(row),
        source=f"kvpool calibrate: {len(samples)} measured steps, efficiencies x {scale:.3f} of {base.name}",
    )
    pred = a @ coef * t
    med, p90 = _errors(pred, t)
    return cal, Fit({"efficiency_scale": scale, "step_floor_s": float(coef[1]), "row_s": float(row)}, med, p90, len(t))


def _nonnegative_lstsq(a: Array, y: Array) -> Array:
    """Least squares with every coefficient >= 0: drop the most negative one and
    refit until none is (exact for the two or three columns fitted here)."""
    keep = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            out = np.zeros(a.shape[1])
            out[keep] = np.maximum(coef, 0.0)
            return out
        keep.pop(int(np.argmin(coef)))


def _check(seconds: Array) -> None:
    if len(seconds) == 0:
        raise CalibrationError("no timings to fit")
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise CalibrationError("every measured time must be a finite number > 0")
