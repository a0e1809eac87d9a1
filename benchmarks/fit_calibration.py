"""Rebuild the shipped step-time calibration (src/kvpool/presets/data/calibration.json)
from Vidur's measured kernel timings.

    python benchmarks/fit_calibration.py                 # fit from tests/data/vidur, print, check
    python benchmarks/fit_calibration.py --write         # ... and write calibration.json
    python benchmarks/fit_calibration.py --extract DIR   # refresh tests/data/vidur from a Vidur copy

Data: Vidur (github.com/microsoft/vidur, MIT; LICENSE and COMMIT kept beside the
copy) profiled each linear layer, norm, RoPE, activation and residual add of
several models at TP 1-8 on A100 80GB and H100 (`<gpu>_<org>_<model>/mlp.csv`),
and FlashInfer attention of Meta-Llama-3-8B on A100. tests/data/vidur keeps the
median columns of those files (`--extract` rebuilds it from the full copy in
../shared/data/calibration/vidur).

What is fitted per GPU, and on what:
- matmul (linear_*): attn_pre_proj (QKV), attn_post_proj (O), mlp_up_proj
  (gate+up), mlp_down_proj at every token count and TP, shapes per rank as
  Vidur sharded them (columns / TP for QKV and up, rows / TP for O and down);
- elementwise (per layer): input_layernorm + post_attention_layernorm +
  attn_rope + mlp_act + 2 x add (two residual adds per layer) against
  tokens x hidden;
- decode attention (A100 only): attn_decode + attn_kv_cache_save against the
  KV bytes read (batch x context x 4096 bytes per layer for Llama-3-8B:
  8 KV heads x 128 x K,V x 2 bytes);
- prefill attention (A100 only): attn_prefill against its causal pair FLOPs
  (4 x 32 heads x 128 x pairs). Vidur's separate kv_cache_save of a prefill
  chunk (a slow unfused append in its Sarathi backend) is left out: engines
  write K/V inside the attention or RoPE kernel.
H100 has no attention profile here: its attention shares of peak and floors
are the A100's (said in each constant's source).

Held out: the fit of each GPU leaves its largest model out (A100: Llama-3-70B,
H100: Qwen-72B) and reports the error on it, then refits on everything for
the shipped constants.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import sys
from pathlib import Path

import numpy as np

from kvpool.presets import DATA, load_gpu
from kvpool.sim.calibration import OpSamples, fit_affine, fit_matmul, matmul_seconds, vidur_samples

HERE = Path(__file__).resolve().parent.parent
VIDUR = HERE / "tests" / "data" / "vidur"
OUT = DATA / "calibration.json"
GPUS = {"a100": "a100", "h100": "h100"}
HELD_OUT = {"a100": "a100_meta-llama_Meta-Llama-3-70B", "h100": "h100_Qwen_Qwen-72B"}
SHAPE_COLUMNS = [
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
]
KV_BYTES_PER_TOKEN_LAYER = 2 * 8 * 128 * 2  # Llama-3-8B: K and V, 8 heads x 128, BF16
PREFILL_FLOPS_PER_PAIR = 4 * 32 * 128  # QK^T and PV, 32 query heads x 128

# Constants the timings here do not measure, each with its source.
FIXED: dict[str, tuple[dict[str, float], str]] = {
    "allreduce_latency_s": (
        {"a100": 6e-6, "h100": 5e-6},
        "SGLang's H100 custom all-reduce unit test (sgl-project/sglang pull request 'optimize custom "
        "allreduce kernel'): 3.7-5.9 us for 512 B at TP 2-8; A100 taken 1 us slower",
    ),
    "allreduce_small_bytes_per_s": (
        {"a100": 20e9, "h100": 40e9},
        "same table: 1 MiB in 19.9/31.1/33.8 us at TP 2/4/8, i.e. ~40 GB/s of message past the latency "
        "at TP 8 on H100; A100 (NVLink 3, half the links' bandwidth) half of it",
    ),
    "allreduce_bus_bytes_per_s": (
        {"a100": 240e9, "h100": 460e9},
        "nccl-tests all_reduce_perf bus bandwidth at large sizes: 8xH100 SXM 460-480 GB/s, 8xA100 SXM "
        "230-250 GB/s (docs.alayanew.com tech blog 'NCCL-tests in practice', reference table)",
    ),
    "moe_tile": (
        {"a100": 16, "h100": 16},
        "vLLM fused_moe Triton kernel default config: BLOCK_SIZE_M 16 for small batches, the decode case",
    ),
    "launch_s": (
        {"a100": 10e-6, "h100": 10e-6},
        "one eager PyTorch op 5-20 us of CPU (learnaivisually.com 'CUDA Graphs for LLM decode'); checked by "
        "Llama-3.1-8B H100 decode 8.4 ms eager vs 5.1 ms graph (cloudai.pt)",
    ),
    "step_floor_s": (
        {"a100": 5e-4, "h100": 5e-4},
        "estimate of engine CPU time per step not hidden behind the GPU (scheduling, input preparation, "
        "sampling), between vLLM V0's 4-13 ms bubbles and the 0.2-0.3 ms its asynchronous scheduling "
        "aims at (vllm-project/vllm RFCs 'Multi-Step Scheduling' and 'Initial Idea and Design for "
        "Asynchronous Scheduling'); a profile of vLLM 0.27.1's engine loop found 541 us per step "
        "(openfabric-systems/simllm 'vLLM step-loop cost attribution study'); refit from your own step "
        "times with `kvpool calibrate --steps`",
    ),
    "row_s": (
        {"a100": 5e-6, "h100": 5e-6},
        "estimate of engine CPU time per request in a step (block tables, positions, detokenisation): "
        "the same vLLM 0.27.1 profile found the scheduler alone at 12.7 us per running request, part of "
        "which asynchronous scheduling hides; refit with `kvpool calibrate --steps`",
    ),
}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def extract(source: Path) -> None:
    """Copy the median columns of Vidur's files, its licence and commit, into tests/data/vidur."""
    VIDUR.mkdir(parents=True, exist_ok=True)
    for name in ("LICENSE", "COMMIT"):
        shutil.copy(source / name, VIDUR / name)
    for d in sorted(p for p in source.iterdir() if p.is_dir()):
        rows = _rows(d / "mlp.csv")
        cols = SHAPE_COLUMNS + [c for c in rows[0] if c.endswith(".median") and c != "time_stats.emb.median"]
        out = VIDUR / f"{d.name}.csv"
        with out.open("w", newline="") as f:
            f.write(
                f"# median columns of microsoft/vidur data/profiling/compute/{d.name.split('_')[0]}/"
                f"{'/'.join(d.name.split('_', 2)[1:])}/mlp.csv @ {(source / 'COMMIT').read_text().strip()} (MIT)\n"
            )
            w = csv.writer(f)
            w.writerow(cols)
            for r in rows:
                w.writerow([r[c] for c in cols])
    for name in ("a100_llama3_8b_attention_decode_extract.csv", "a100_llama3_8b_attention_prefill_extract.csv"):
        shutil.copy(source / name, VIDUR / name)


def _samples(files: list[Path]) -> OpSamples:
    rows = [r for path in files for r in _rows(path)]
    return vidur_samples(rows)


def fit_gpu(gpu: str, files: list[Path], report: dict[str, object]) -> dict[str, object]:
    spec = load_gpu(GPUS[gpu])
    hbm = spec.hbm_bandwidth_bytes_per_s
    ops = _samples(files)
    mm = fit_matmul(ops.tokens, ops.k, ops.n, ops.seconds, flops=spec.bf16_flops, hbm=hbm)
    e_floor, e_slope, ew = fit_affine(ops.elementwise_x / hbm, ops.elementwise_s)
    names = ", ".join(p.stem for p in files)
    out: dict[str, object] = dict(mm.values)
    out["elementwise_floor_s"] = e_floor
    out["elementwise_bytes"] = e_slope
    report[gpu] = {
        "matmul": {"median_error": mm.median_error, "p90_error": mm.p90_error, "samples": mm.samples},
        "elementwise": {"median_error": ew.median_error, "p90_error": ew.p90_error, "samples": ew.samples},
    }
    out["_sources"] = {
        "linear_*": f"fitted on Vidur mlp.csv matmul medians of {names}",
        "elementwise_*": f"fitted on Vidur norm/RoPE/act/add medians of {names}",
    }
    return out


def fit_attention(report: dict[str, object]) -> dict[str, float]:
    a100 = load_gpu("a100")
    dec = _rows(VIDUR / "a100_llama3_8b_attention_decode_extract.csv")
    kv_bytes = np.array([int(r["kv"]) * int(r["batch"]) * KV_BYTES_PER_TOKEN_LAYER for r in dec], dtype=np.float64)
    t = np.array([(float(r["attn_decode_ms"]) + float(r["kv_save_ms"])) * 1e-3 for r in dec])
    d_floor, d_slope, dfit = fit_affine(kv_bytes / a100.hbm_bandwidth_bytes_per_s, t)
    pre = _rows(VIDUR / "a100_llama3_8b_attention_prefill_extract.csv")
    chunk = np.array([int(r["chunk"]) for r in pre], dtype=np.float64)
    cached = np.array([int(r["kv"]) for r in pre], dtype=np.float64)
    flops = PREFILL_FLOPS_PER_PAIR * (chunk * cached + chunk * (chunk + 1) / 2)
    tp = np.array([float(r["attn_prefill_ms"]) * 1e-3 for r in pre])
    p_floor, p_slope, pfit = fit_affine(flops / a100.bf16_flops, tp)
    report["attention"] = {
        "decode": {"median_error": dfit.median_error, "p90_error": dfit.p90_error, "samples": dfit.samples},
        "prefill": {"median_error": pfit.median_error, "p90_error": pfit.p90_error, "samples": pfit.samples},
    }
    return {
        "decode_attn_floor_s": d_floor,
        "decode_attn_bw_eff": 1.0 / d_slope,
        "prefill_attn_floor_s": p_floor,
        "prefill_attn_flops_eff": 1.0 / p_slope,
    }


def held_out_error(gpu: str, train: list[Path], test: Path) -> dict[str, float]:
    spec = load_gpu(GPUS[gpu])
    fit, held = _samples(train), _samples([test])
    mm = fit_matmul(fit.tokens, fit.k, fit.n, fit.seconds, flops=spec.bf16_flops, hbm=spec.hbm_bandwidth_bytes_per_s)
    pred = matmul_seconds(
        mm.values, held.tokens, held.k, held.n, flops=spec.bf16_flops, hbm=spec.hbm_bandwidth_bytes_per_s
    )
    t2 = held.seconds
    e = np.abs(pred / t2 - 1)
    return {"median_error": float(np.median(e)), "p90_error": float(np.quantile(e, 0.9)), "samples": len(t2)}


def build() -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    report: dict[str, object] = {}
    attention = fit_attention(report)
    profiles: dict[str, dict[str, object]] = {}
    for gpu in GPUS:
        files = sorted(VIDUR.glob(f"{gpu}_*.csv"))
        files = [f for f in files if "attention" not in f.name]
        held = VIDUR / f"{HELD_OUT[gpu]}.csv"
        report[f"{gpu}_held_out_{held.stem}"] = held_out_error(gpu, [f for f in files if f != held], held)
        prof = fit_gpu(gpu, files, report)
        prof.update(attention)
        sources = dict(prof.pop("_sources"))  # type: ignore[call-overload]
        where = "fitted on Vidur's A100 Meta-Llama-3-8B FlashInfer attention profile"
        sources["*_attn_*"] = (
            where if gpu == "a100" else where + " (no H100 attention profile: the A100's shares of peak)"
        )
        sources["moe_floor_s"] = "router, top-k, permute and un-permute: four small kernels at the matmul floor"
        prof["moe_floor_s"] = 4 * float(prof["linear_floor_s"])  # type: ignore[arg-type]
        for key, (values, source) in FIXED.items():
            prof[key] = values[gpu]
            sources[key] = source
        prof["source"] = f"benchmarks/fit_calibration.py on tests/data/vidur (microsoft/vidur, MIT): {GPUS[gpu]}"
        prof["sources"] = sources
        profiles[gpu] = prof
    return profiles, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write src/kvpool/presets/data/calibration.json")
    ap.add_argument(
        "--extract", type=Path, help="refresh tests/data/vidur from a Vidur copy (../shared/data/calibration/vidur)"
    )
    args = ap.parse_args()
    if args.extract:
        extract(args.extract)
    profiles, report = build()
    print(f"machine: {platform.machine()} {platform.python_version()}")
    print(json.dumps(report, indent=2))
    if args.write:
        body = {
            "_notes": "Step-time model constants (kvpool/sim/kernels.py), rebuilt by benchmarks/fit_calibration.py. "
            "Derived from Vidur's measured timings (MIT licence: VIDUR-LICENSE beside this file).",
            "fit_report": report,
            "profiles": profiles,
        }
        OUT.write_text(json.dumps(body, indent=2) + "\n")
        shutil.copy(VIDUR / "LICENSE", OUT.parent / "VIDUR-LICENSE")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
