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

Timing steps on each engine (the same model, GPU and --tp as given here; equal
prompts, so that the decoding requests' history is known: the prompt plus the
tokens decoded so far):

- vLLM (0.32): `vllm serve MODEL --enable-logging-iteration-details` logs each
  step as "Iteration(N): C context requests, T context tokens, G generation
  requests, ... iteration elapsed time: X ms": a row is decode_rows G,
  prefill_tokens T (one context request), ms X. Or `vllm bench latency`:
  `--batch-size 1 --input-len I --output-len 1` times one prefill of I tokens;
  at `--batch-size B`, (the latency of `--output-len K+1` - that of
  `--output-len 1`) / K is one decode step of B rows at context about I + K/2.
- SGLang: `python -m sglang.benchmark.one_batch --model-path MODEL --tp N
  --batch-size 1 8 64 256 --input-len 1024 --output-len 32` writes
  prefill_latency and median_decode_latency per batch size to result.jsonl: a
  decode row is decode_rows B, context I + 16, ms median_decode_latency x 1000;
  at batch size 1 a prefill row is prefill_tokens I, ms prefill_latency x 1000.
- TensorRT-LLM (PyTorch backend): `print_iter_log: true` in the
  --extra_llm_api_options YAML logs each iteration's host_step_time and
  prev_device_step_time (ms) with states num_ctx_tokens and
  num_generation_tokens: decode_rows = num_generation_tokens (no drafts),
  prefill_tokens = num_ctx_tokens, ms = host_step_time.

Three steps at least, and steps of different sizes: the fit needs them to tell
the floor from the work. A fit that puts any kernel above 100 % of the GPU's
peak is refused (the times are not of this model on this GPU, or not in ms).
The profile (`-o`, JSON) is what `kvpool simulate --calibration FILE` uses.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from kvpool.cli.common import add_json_arg, add_model_args, checked, print_json, table
from kvpool.cli.files import input_file, output_file, write_output
from kvpool.deploy.calibrating import CalibrationResult, calibrate
from kvpool.deploy.gpus import gpu_and_count


def register(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's step-time constants to your measurements",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    p.add_argument(
        "--gpu",
        type=checked(gpu_and_count),
        required=True,
        metavar="NAME[xN]",
        help="the GPU the measurements ran on (kvpool gpus); NAMExN: N of them as tensor parallelism",
    )
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


def run(args: argparse.Namespace) -> int:
    keywords = {k: getattr(args, k) for k in ("kv_dtype", "tp", "pp", "ep", "dp", "tokens_per_block")}
    found = calibrate(args.model, gpu=args.gpu, steps=args.steps, ops=args.ops, name=args.out.stem, **keywords)
    write_output(args.out, found.profile, "--out")
    if args.json:
        print_json({"profile": str(args.out), "calibration": found.calibration.to_json(), "fit": found.report})
        return 0
    print(render(found))
    print(f"wrote {args.out}; use it with: kvpool simulate ... --calibration {args.out}")
    return 0


def render(found: CalibrationResult) -> str:
    """The constants the fit changed (before, fitted) and each fit's median error."""
    cal, base, report = found.calibration, found.base, found.report
    keys = [f.name for f in dataclasses.fields(cal) if f.name not in ("name", "source")]
    rows = [
        (k, f"{getattr(base, k):.4g}", f"{getattr(cal, k):.4g}") for k in keys if getattr(base, k) != getattr(cal, k)
    ]
    lines = [table(["constant", "before", "fitted"], rows) if rows else "nothing changed"]
    for part in ("ops", "steps"):
        if part in report:
            fits = report[part] if part == "steps" else report[part]["matmul"]
            lines.append(f"{part}: median error {fits['median_error']:.1%} over {fits['samples']} measurements")
    return "\n".join(lines)
