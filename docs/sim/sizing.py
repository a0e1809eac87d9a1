"""The held-out-style evaluation of docs/sim.md ("Sizing on traffic it has not
seen"): for each (model, trace) pair, a `--sweep-ratio` grid of splits and the
named policies, each as a share of the best split.

    PYTHONPATH=src python docs/sim/sizing.py [CASE ...]

Writes docs/sim/sizing_<case>.json (runs and settings) and prints one table
row per case. Runs serially; `kvpool sweep` does the same on Ray.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from kvpool.plan import ServingLimits
from kvpool.presets import load_gpu
from kvpool.presets.traces import load_trace
from kvpool.sim import StepTimeModel, load_weights, simulate
from kvpool.sim.policies import plan_for, ratio_policy, sweep_shares
from kvpool.spec import load_model_spec

OUT = Path(__file__).parent
GiB = 2**30
POLICIES = ("reference", "typical", "workload", "occupancy", "tuned")

# case: model, gpu, kv dtype, KV GiB, B, L, N, trace, max requests, sweep range
CASES = {
    "gemma4_azure_conv": ("gemma-4-26b-a4b", "b200", "fp8", 60, 256, 32768, 8192, "azure-conv", None, (0.05, 0.95)),
    "gemma3_azure_code": ("gemma-3-27b", "h100", "auto", 20, 256, 8192, 8192, "azure-code", None, (0.05, 0.95)),
    "gptoss20b_mooncake": ("gpt-oss-20b", "h100", "auto", 40, 256, 65536, 8192, "mooncake-conv", 4000, (0.002, 0.2)),
    "gemma3_16g_azure_code": ("gemma-3-27b", "h100", "auto", 16, 256, 8192, 8192, "azure-code", None, (0.05, 0.95)),
    "gemma3_azure_conv": ("gemma-3-27b", "h100", "auto", 12, 256, 8192, 8192, "azure-conv", 8000, (0.05, 0.95)),
    "gptoss20b_azure_code": ("gpt-oss-20b", "h100", "auto", 4, 256, 8192, 8192, "azure-code", None, (0.002, 0.2)),
    "gemma4_20g_azure_code": ("gemma-4-26b-a4b", "b200", "fp8", 8, 256, 8192, 8192, "azure-code", None, (0.05, 0.95)),
}


def evaluate(case: str) -> dict[str, object]:
    model, gpu, dtype, kv_gib, b, max_len, n, trace_name, max_req, (lo, hi) = CASES[case]
    spec = load_model_spec(model, kv_dtype=dtype, max_seq_len=max_len)
    limits = ServingLimits(max_batch_size=b, max_seq_len=max_len, max_num_tokens=n, avg_seq_len=max_len)
    trace = load_trace(trace_name, max_requests=max_req).with_rate(math.inf)
    steps = StepTimeModel.build(spec, load_gpu(gpu), load_weights(model))
    kv = int(kv_gib * GiB)
    group = next(g.name for g in spec.groups if g.kind != "full")
    runs = []
    for policy in [*POLICIES, *(ratio_policy(group, s) for s in sweep_shares(10, lo, hi))]:
        t0 = time.perf_counter()
        try:
            pp = plan_for(spec, limits, policy, kv_memory_bytes=kv, trace=trace, model=steps)
        except Exception as e:  # noqa: BLE001 - an infeasible split is a point of the curve
            runs.append({"policy": policy, "error": str(e)})
            continue
        plan_s = time.perf_counter() - t0
        r = simulate(pp.plan, trace, steps, policy=policy)
        runs.append(
            {
                **r.to_json(),
                "share": pp.plan.group(group).share,
                "notes": list(pp.notes),
                "plan_s": plan_s,
                "run_s": r.wall_s,
            }
        )
        print(
            f"{case} {policy}: {r.output_tokens_per_s:,.1f} tok/s "
            f"(share {pp.plan.group(group).share:.4f}, plan {plan_s:.0f} s)",
            flush=True,
        )
    out = {
        "settings": {
            "case": case,
            "model": model,
            "gpu": gpu,
            "kv_dtype": dtype,
            "kv_gib": kv_gib,
            "B": b,
            "L": max_len,
            "N": n,
            "trace": trace_name,
            "max_requests": max_req,
            "group": group,
        },
        "runs": runs,
    }
    (OUT / f"sizing_{case}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def summary(out: dict[str, object]) -> str:
    runs = [r for r in out["runs"] if "error" not in r]  # type: ignore[union-attr]
    best = max(r["output_tokens_per_s"] for r in runs if r["policy"].startswith("ratio:"))
    by = {r["policy"]: r["output_tokens_per_s"] / best for r in runs}
    cells = " | ".join(f"{100 * by[p]:.1f} %" if p in by else "-" for p in POLICIES)
    return f"| {out['settings']['case']} | {best:,.0f} | {cells} |"  # type: ignore[index]


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        print(summary(evaluate(name)), flush=True)
