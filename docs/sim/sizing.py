"""The held-out-style evaluation of docs/sim.md ("Sizing on traffic it has not
seen"): for each (model, trace) pair, a `--sweep-ratio` grid of splits and the
named policies, each as a share of the best split.

    PYTHONPATH=src python docs/sim/sizing.py [CASE ...]          # everything
    PYTHONPATH=src python docs/sim/sizing.py --extra [CASE ...]  # add EXTRA
    PYTHONPATH=src python docs/sim/sizing.py --table             # print the table

The first writes docs/sim/sizing_<case>.json (runs and settings) and prints one
table row per case. `--extra` loads that JSON and runs only the policies of
EXTRA it does not hold yet (the online `rebalance` and the engines' own
splits), with the case's settings, appending each run to the JSON as it ends
(so an interrupted case keeps what finished); the sweep and `tuned` are not
rerun. `--table` prints the docs/sim.md table from the JSONs. Runs serially;
`kvpool sweep` does the same on Ray.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.plan import ServingLimits
from kvpool.presets import load_gpu
from kvpool.presets.traces import load_trace
from kvpool.sim import StepTimeModel, load_weights, simulate
from kvpool.sim.policies import plan_for, ratio_policy, sweep_shares
from kvpool.sim.rebalance_sim import simulate_rebalanced
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.trace import Trace

OUT = Path(__file__).parent
GiB = 2**30
POLICIES = ("reference", "typical", "workload", "occupancy", "tuned")
EXTRA = ("rebalance", "engine:vllm", "engine:sglang", "engine:trtllm")
COLUMNS = (*POLICIES, *EXTRA)
HEADERS = {"typical": "typical (S = L)"}

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


@dataclass(frozen=True)
class Case:
    """One pair's fixed settings: everything a run of any policy shares."""

    name: str
    spec: ModelSpec
    limits: ServingLimits
    trace: Trace
    steps: StepTimeModel
    kv: int
    group: str  # the swept (sliding) group


def load_case(case: str) -> Case:
    """Builds the case's spec, limits, offline trace and step model (no runs)."""
    model, gpu, dtype, kv_gib, b, max_len, n, trace_name, max_req, _ = CASES[case]
    spec = load_model_spec(model, kv_dtype=dtype, max_seq_len=max_len)
    limits = ServingLimits(max_batch_size=b, max_seq_len=max_len, max_num_tokens=n, avg_seq_len=max_len)
    trace = load_trace(trace_name, max_requests=max_req).with_rate(math.inf)
    steps = StepTimeModel.build(spec, load_gpu(gpu), load_weights(model))
    group = next(g.name for g in spec.groups if g.kind != "full")
    return Case(case, spec, limits, trace, steps, int(kv_gib * GiB), group)


def run_policy(c: Case, policy: str) -> dict[str, Any]:
    """Plans and simulates one policy on the case, as `kvpool simulate --policy`
    does (`rebalance` online from the reference split); an infeasible plan
    (an engine that would refuse to start, a split too small) is recorded as
    an error. Prints one progress line."""
    t0 = time.perf_counter()
    try:
        pp = plan_for(c.spec, c.limits, policy, kv_memory_bytes=c.kv, trace=c.trace, model=c.steps)
    except Exception as e:  # noqa: BLE001 - an infeasible split is a point of the curve
        print(f"{c.name} {policy}: {e}", flush=True)
        return {"policy": policy, "error": str(e)}
    plan_s = time.perf_counter() - t0
    if policy == "rebalance":
        r, _ = simulate_rebalanced(pp.plan, c.trace, c.steps)
    else:
        r = simulate(pp.plan, c.trace, c.steps, policy=policy)
    share = pp.plan.share_of(c.group)  # a shared pool (engine:vllm): the share its layers hold
    print(
        f"{c.name} {policy}: {r.output_tokens_per_s:,.1f} tok/s (share {share:.4f}, plan {plan_s:.0f} s, "
        f"run {r.wall_s:.0f} s)",
        flush=True,
    )
    return {**r.to_json(), "share": share, "notes": list(pp.notes), "plan_s": plan_s, "run_s": r.wall_s}


def settings(case: str, group: str) -> dict[str, Any]:
    model, gpu, dtype, kv_gib, b, max_len, n, trace_name, max_req, _ = CASES[case]
    return {
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
    }


def write(case: str, out: dict[str, Any]) -> None:
    (OUT / f"sizing_{case}.json").write_text(json.dumps(out, indent=1) + "\n")


def evaluate(case: str) -> dict[str, Any]:
    """Every policy and the sweep grid; writes the case's JSON."""
    c = load_case(case)
    lo, hi = CASES[case][-1]
    runs = [
        run_policy(c, p) for p in [*POLICIES, *EXTRA, *(ratio_policy(c.group, s) for s in sweep_shares(10, lo, hi))]
    ]
    out = {"settings": settings(case, c.group), "runs": runs}
    write(case, out)
    return out


def extend(case: str) -> dict[str, Any]:
    """The policies of EXTRA the case's JSON lacks, appended to it one by one."""
    out: dict[str, Any] = json.loads((OUT / f"sizing_{case}.json").read_text())
    have = {r["policy"] for r in out["runs"]}
    missing = [p for p in EXTRA if p not in have]
    if missing:
        c = load_case(case)
        assert c.group == out["settings"]["group"], (c.group, out["settings"])
        for p in missing:
            out["runs"].append(run_policy(c, p))
            write(case, out)
    return out


def label(s: dict[str, Any]) -> str:
    """`gemma-3-27b, h100, 12 GiB, 8k, azure-conv (8,000)`, from a JSON's settings."""
    kv = f"{s['kv_dtype']} {s['kv_gib']} GiB" if s["kv_dtype"] != "auto" else f"{s['kv_gib']} GiB"
    n = f" ({s['max_requests']:,})" if s["max_requests"] else ""
    return f"{s['model']}, {s['gpu']}, {kv}, {s['L'] // 1024}k, {s['trace']}{n}"


def cell(run: dict[str, Any] | None, best: float) -> str:
    if run is None:
        return "-"
    if "error" in run:
        return "refused" if run["policy"].startswith("engine:") else "infeasible"
    return f"{100 * run['output_tokens_per_s'] / best:.1f} %"


def summary(out: dict[str, Any]) -> str:
    """One table row: best swept tok/s, then each column's share of it."""
    ok = [r for r in out["runs"] if "error" not in r]
    best = max(r["output_tokens_per_s"] for r in ok if r["policy"].startswith("ratio:"))
    by = {r["policy"]: r for r in out["runs"]}
    cells = " | ".join(cell(by.get(p), best) for p in COLUMNS)
    return f"| {label(out['settings'])} | {best:,.0f} | {cells} |"


def table(cases: list[str]) -> str:
    """The docs/sim.md table from the cases' JSONs."""
    head = ["case (model, GPU, KV, L, trace)", "best tok/s", *(HEADERS.get(p, p) for p in COLUMNS)]
    rows = [summary(json.loads((OUT / f"sizing_{c}.json").read_text())) for c in cases]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows])


def main(argv: list[str]) -> None:
    mode = argv[0] if argv and argv[0] in ("--extra", "--table") else None
    cases = [a for a in argv if a != mode] or list(CASES)
    if mode == "--table":
        print(table(cases))
        return
    for name in cases:
        print(summary(extend(name) if mode == "--extra" else evaluate(name)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
