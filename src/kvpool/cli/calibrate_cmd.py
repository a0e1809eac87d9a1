"""`kvpool calibrate`: fit the step-time model's constants to your own measurements.

Two kinds of measurement, either or both:

- `--steps FILE.csv` with MODEL: whole steps timed on your engine and GPU,
  one per row: `decode_rows` (requests decoding), `context` (their mean
  history), `prefill_tokens` (tokens of one prefill chunk in the step, 0 for
  none; `prefill_start` its cached tokens, default 0) and `ms` (or `seconds`).
  Fitted: one factor on every efficiency of the GPU's profile, the per-step
  floor and the per-request CPU time (`sim.calibration.fit_steps`).
- `--ops FILE.csv` (repeatable): matmul and elementwise timings in Vidur's
  profiler layout (`mlp.csv`: n_head, n_kv_head, n_embd, n_expanded_embd,
  use_gated_mlp, num_tokens, num_tensor_parallel_workers and
  time_stats.<op>.median in ms), as benchmarks/fit_calibration.py reads them.

The profile (`-o`, JSON) is what `kvpool simulate --calibration FILE` uses.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from kvpool.cli.common import add_json_arg, add_model_args, checked, flagged, gpu_name, print_json, table
from kvpool.cli.files import input_file, output_file, write_output
from kvpool.cli.plan_args import load_spec
from kvpool.cli.request import ModelOptions
from kvpool.errors import KvpoolError
from kvpool.plan.limits import MAX_BATCH_SIZE, MAX_POSITIONS
from kvpool.presets import GpuSpec, load_gpu
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
from kvpool.sim.steptime import StepTimeModel, load_weights


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's step-time constants to your measurements",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument("--gpu", type=checked(gpu_name), required=True, help="the GPU the measurements ran on (kvpool gpus)")
    p.add_argument(
        "--steps", type=input_file, default=None, metavar="FILE.csv", help="measured step times (columns above)"
    )
    p.add_argument(
        "--ops", type=input_file, action="append", default=[], metavar="FILE.csv", help="Vidur-layout kernel timings"
    )
    p.add_argument(
        "-o", "--out", type=output_file, required=True, metavar="PROFILE.json", help="where to write the profile"
    )
    add_json_arg(p)
    p.set_defaults(func=run)


def _rows(path: Path, need: tuple[str, ...]) -> list[dict[str, str]]:
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


def _number(row: dict[str, str], key: str, path: Path, line: int, *, minimum: float = 0.0) -> float:
    try:
        value = float(row[key])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise KvpoolError(f"{path} row {line}: {key} must be a number >= {minimum:g}, got {_shown(row[key])}")
    return value


def _count(row: dict[str, str], key: str, path: Path, line: int, high: int) -> int:
    """A whole number in [0, high] (a step of 10**9 decode rows is no measurement,
    and pricing it would build a billion-row batch)."""
    value = _number(row, key, path, line)
    if not value.is_integer() or value > high:
        raise KvpoolError(f"{path} row {line}: {key} must be a whole number <= {high:,}, got {_shown(row[key])}")
    return int(value)


def _shown(text: str | None) -> str:
    """A cell as an error shows it: quoted, cut at 40 characters."""
    return repr(text if text is None or len(text) <= 40 else text[:37] + "...")


def ops_samples(paths: list[Path]) -> OpSamples:
    """The Vidur-layout timings of `paths`, as one set of samples."""
    parts = []
    for path in paths:
        try:
            parts.append(vidur_samples(_rows(path, VIDUR_COLUMNS)))
        except CalibrationError as e:
            raise KvpoolError(f"--ops {path}: {e}") from None
    fields = [f.name for f in dataclasses.fields(OpSamples)]
    return OpSamples(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))


def step_samples(path: Path, model: StepTimeModel) -> list[StepSample]:
    """Each measured step priced by `model` (its GPU time, floors excluded)."""
    rows = _rows(path, ("decode_rows", "context", "prefill_tokens"))
    if "ms" not in rows[0] and "seconds" not in rows[0]:
        raise KvpoolError(f"{path} needs an 'ms' or 'seconds' column with the measured step time")
    out = []
    for i, r in enumerate(rows, start=2):
        rows_n = _count(r, "decode_rows", path, i, MAX_BATCH_SIZE)
        ctx = _count(r, "context", path, i, MAX_POSITIONS)
        pre = _count(r, "prefill_tokens", path, i, MAX_POSITIONS)
        start = _count(r, "prefill_start", path, i, MAX_POSITIONS) if r.get("prefill_start") not in (None, "") else 0
        seconds = _number(r, "ms", path, i) * 1e-3 if "ms" in r else _number(r, "seconds", path, i)
        if rows_n + pre == 0 or seconds <= 0:
            raise KvpoolError(f"{path} row {i}: a step needs decode rows or prefill tokens, and a time > 0")
        cost = model.cost(
            [(ctx, 0)] * rows_n, [(start, pre)] if pre else [], graph=pre == 0, padded_batch=rows_n or None
        )
        out.append(StepSample(float(cost.total - cost.overhead), rows_n + (1 if pre else 0), seconds))
    return out


def step_model(args: argparse.Namespace, gpu: GpuSpec, cal: Calibration) -> StepTimeModel:
    """MODEL's step-time model on one rank of --tp at the constants `cal`."""
    options = ModelOptions.from_args(args)
    spec, _ = load_spec(options, None)
    weights = load_weights(args.model)
    share = 1 / options.tp
    weights = dataclasses.replace(
        weights, total_params=weights.total_params * share, active_params=weights.active_params * share
    )
    return StepTimeModel.build(spec, gpu, weights, cal)


def run(args: argparse.Namespace) -> int:
    if args.steps is None and not args.ops:
        raise KvpoolError("give --steps FILE.csv and/or --ops FILE.csv: the measurements to fit")
    gpu = load_gpu(args.gpu)
    base = dataclasses.replace(for_gpu(gpu), name=args.out.stem)
    report: dict[str, Any] = {"gpu": gpu.key, "from": base.name}
    cal = base
    if args.ops:
        with flagged("--ops"):
            ops = ops_samples(args.ops)
            cal, ops_report = fit_ops(ops, cal, flops=gpu.bf16_flops, hbm=gpu.hbm_bandwidth_bytes_per_s)
        report["ops"] = ops_report
    if args.steps is not None:
        model = step_model(args, gpu, cal)
        with flagged("--steps"):
            samples = step_samples(args.steps, model)
            cal, fit = fit_steps(cal, samples)
        report["steps"] = {
            **fit.values,
            "median_error": fit.median_error,
            "p90_error": fit.p90_error,
            "samples": fit.samples,
        }
    cal = dataclasses.replace(cal, name=args.out.stem, source=f"kvpool calibrate on {gpu.key}")
    with flagged("--steps" if args.steps is not None else "--ops"):
        text = profile_json(cal, report=report)
    write_output(args.out, text, "--out")
    if args.json:
        print_json({"profile": str(args.out), "calibration": cal.to_json(), "fit": report})
        return 0
    keys = [f.name for f in dataclasses.fields(cal) if f.name not in ("name", "source")]
    rows = [
        (k, f"{getattr(base, k):.4g}", f"{getattr(cal, k):.4g}") for k in keys if getattr(base, k) != getattr(cal, k)
    ]
    print(table(["constant", "before", "fitted"], rows) if rows else "nothing changed")
    for part in ("ops", "steps"):
        if part in report:
            fits = report[part] if part == "steps" else report[part]["matmul"]
            print(f"{part}: median error {fits['median_error']:.1%} over {fits['samples']} measurements")
    print(f"wrote {args.out}; use it with: kvpool simulate ... --calibration {args.out}")
    return 0
