"""`calibrate`: fit the step-time model's constants to measurements of your own
(`kvpool calibrate`; its --help says how to time steps on each engine).

- steps: a CSV of whole steps timed on your engine and GPU, one per row:
  `decode_rows` (requests decoding), `context` (their mean history),
  `prefill_tokens` (tokens of one prefill chunk in the step, 0 for none;
  `prefill_start` its cached tokens, default 0) and `ms` (or `seconds`). Fitted:
  one factor on every efficiency of the GPU's profile, the per-step floor and the
  per-request CPU time (`sim.calibration.fit_steps`).
- ops: CSVs of matmul and elementwise timings in Vidur's profiler layout
  (`sim.calibration.VIDUR_COLUMNS`), as benchmarks/fit_calibration.py reads them.

A fit that puts a kernel above 100 % of the GPU's peak is refused
(`sim.kernels.Calibration` holds no efficiency above 1).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from kvpool import presets
from kvpool.deploy.options import PlanKeywords, PlanRequest
from kvpool.deploy.rank_steps import rank_step_model
from kvpool.errors import KvpoolError, flagged
from kvpool.plan.limits import MAX_BATCH_SIZE, MAX_POSITIONS
from kvpool.sim.calibration import (
    VIDUR_COLUMNS,
    OpSamples,
    StepSample,
    fit_ops,
    fit_steps,
    for_gpu,
    profile_json,
    vidur_samples,
)
from kvpool.sim.kernels import Calibration, CalibrationError
from kvpool.sim.steptime import StepTimeModel


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted profile (`calibration`), the GPU's shipped one it started from
    (`base`), and the fit's report (errors, samples, fitted values)."""

    calibration: Calibration
    base: Calibration
    report: dict[str, Any]

    @property
    def profile(self) -> str:
        """The profile file's text (`simulate --calibration` reads it)."""
        return profile_json(self.calibration, report=self.report)


def calibrate(
    model: str,
    *,
    gpu: str,
    steps: str | Path | None = None,
    ops: Sequence[str | Path] = (),
    name: str = "custom",
    **options: Unpack[PlanKeywords],
) -> CalibrationResult:
    """Fit the step-time constants of `gpu` (NAME or NAMExN: N GPUs as tensor
    parallelism) to measured `steps` of `model` and/or kernel timings `ops`
    (module docstring); the profile is called `name`. `options`: the model's
    `PlanKeywords` (kv_dtype, tp, ...). Raises KvpoolError naming the file, row and
    column of a bad measurement, or a fit no GPU could run."""
    if steps is None and not ops:
        raise KvpoolError("give --steps FILE.csv and/or --ops FILE.csv: the measurements to fit")
    request = PlanRequest.of(model, gpu, **options)
    spec = presets.load_gpu(str(request.budget.gpu))
    base = dataclasses.replace(for_gpu(spec), name=name)
    report: dict[str, Any] = {"gpu": spec.key, "from": base.name}
    cal = base
    if ops:
        with flagged("--ops"):
            cal, report["ops"] = fit_ops(
                ops_samples([Path(p) for p in ops]), cal, flops=spec.bf16_flops, hbm=spec.hbm_bandwidth_bytes_per_s
            )
    if steps is not None:
        with flagged("--steps"):
            samples = step_samples(Path(steps), rank_step_model(request, spec, cal))
            cal, fit = fit_steps(cal, samples)
        report["steps"] = {
            **fit.values,
            "median_error": fit.median_error,
            "p90_error": fit.p90_error,
            "samples": fit.samples,
        }
    found = CalibrationResult(
        dataclasses.replace(cal, name=name, source=f"kvpool calibrate on {spec.key}"), base, report
    )
    with flagged("--steps" if steps is not None else "--ops"):
        found.profile  # noqa: B018 -- a fit with a non-finite number in it is refused here, not when written
    return found


def csv_rows(path: Path, need: tuple[str, ...]) -> list[dict[str, str]]:
    """The CSV's rows (lines starting with # skipped); KvpoolError naming what is missing."""
    try:
        with path.expanduser().open(newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's BOM
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    except OSError as e:
        raise KvpoolError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise KvpoolError(f"{path} is not a CSV file ({e})") from None
    if not rows:
        raise KvpoolError(f"{path} has no rows")
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise KvpoolError(f"{path} lacks column(s) {', '.join(missing)}; see `kvpool calibrate --help`")
    return rows


def number(row: dict[str, str], key: str, path: Path, line: int, *, minimum: float = 0.0) -> float:
    try:
        value = float(row[key])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise KvpoolError(f"{path} row {line}: {key} must be a number >= {minimum:g}, got {shown(row[key])}")
    return value


def count(row: dict[str, str], key: str, path: Path, line: int, high: int) -> int:
    """A whole number in [0, high] (a step of 10**9 decode rows is no measurement,
    and pricing it would build a billion-row batch)."""
    value = number(row, key, path, line)
    if not value.is_integer() or value > high:
        raise KvpoolError(f"{path} row {line}: {key} must be a whole number <= {high:,}, got {shown(row[key])}")
    return int(value)


def shown(text: str | None) -> str:
    """A cell as an error shows it: quoted, cut at 40 characters."""
    return repr(text if text is None or len(text) <= 40 else text[:37] + "...")


def ops_samples(paths: list[Path]) -> OpSamples:
    """The Vidur-layout timings of `paths`, as one set of samples."""
    parts = []
    for path in paths:
        try:
            parts.append(vidur_samples(csv_rows(path, VIDUR_COLUMNS)))
        except CalibrationError as e:
            raise KvpoolError(f"--ops {path}: {e}") from None
    fields = [f.name for f in dataclasses.fields(OpSamples)]
    return OpSamples(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))


def step_samples(path: Path, model: StepTimeModel) -> list[StepSample]:
    """Each measured step priced by `model` (its GPU time, floors excluded)."""
    rows = csv_rows(path, ("decode_rows", "context", "prefill_tokens"))
    if "ms" not in rows[0] and "seconds" not in rows[0]:
        raise KvpoolError(f"{path} needs an 'ms' or 'seconds' column with the measured step time")
    return [step_sample(r, path, line, model) for line, r in enumerate(rows, start=2)]


def step_sample(r: dict[str, str], path: Path, line: int, model: StepTimeModel) -> StepSample:
    """One row of measured steps (module docstring), priced by `model`."""
    decodes = count(r, "decode_rows", path, line, MAX_BATCH_SIZE)
    ctx, pre = (count(r, k, path, line, MAX_POSITIONS) for k in ("context", "prefill_tokens"))
    start = count(r, "prefill_start", path, line, MAX_POSITIONS) if r.get("prefill_start") not in (None, "") else 0
    seconds = number(r, "ms", path, line) * 1e-3 if "ms" in r else number(r, "seconds", path, line)
    if decodes + pre == 0 or seconds <= 0:
        raise KvpoolError(f"{path} row {line}: a step needs decode rows or prefill tokens, and a time > 0")
    prefill = [(start, pre)] if pre else []
    cost = model.cost([(ctx, 0)] * decodes, prefill, graph=pre == 0, padded_batch=decodes or None)
    return StepSample(float(cost.total - cost.overhead), decodes + len(prefill), seconds)
