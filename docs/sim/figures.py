"""Regenerate the numbers and plots of docs/sim.md (takes a few minutes).

    PYTHONPATH=src python docs/sim/figures.py [gemma|sweeps|all|<case name>]

Writes docs/sim/<case>.json (the `kvpool simulate --json` runs plus the
settings) and docs/sim/<case>.png, and prints markdown tables.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from kvpool.plan import ServingLimits
from kvpool.presets import load_gpu
from kvpool.presets.traces import load_trace
from kvpool.sim import SimResult, StepTimeModel, load_weights, simulate
from kvpool.sim.plot import plot_runs
from kvpool.sim.policies import plan_for, ratio_policy, resolve_group, sweep_shares
from kvpool.spec import load_model_spec

OUT = Path(__file__).parent
GiB = 2**30

# (case, model, gpu, kv dtype, KV GiB, B, L, N, S for `typical`, trace, max requests, swept
#  group, sweep range)
SWEEPS = [
    (
        "gemma4_azure_conv",
        "gemma-4-26b-a4b",
        "b200",
        "fp8",
        60,
        256,
        32768,
        8192,
        32768,
        "azure-conv",
        None,
        "sliding",
        (0.05, 0.95),
    ),
    (
        "gemma3_azure_code",
        "gemma-3-27b",
        "h100",
        "auto",
        20,
        256,
        8192,
        8192,
        8192,
        "azure-code",
        None,
        "sliding",
        (0.05, 0.95),
    ),
    (
        "gptoss20b_mooncake",
        "gpt-oss-20b",
        "h100",
        "auto",
        40,
        256,
        65536,
        8192,
        65536,
        "mooncake-conv",
        4000,
        "sliding",
        (0.002, 0.2),
    ),
]


def setup(
    model: str,
    gpu: str,
    dtype: str,
    kv_gib: int,
    b: int,
    max_len: int,
    n: int,
    s: int | None,
    trace_name: str,
    max_requests: int | None,
):
    spec = load_model_spec(model, kv_dtype=dtype, max_seq_len=max_len)
    limits = ServingLimits(max_batch_size=b, max_seq_len=max_len, max_num_tokens=n, avg_seq_len=s)
    trace = load_trace(trace_name, max_requests=max_requests).with_rate(math.inf)
    step_model = StepTimeModel.build(spec, load_gpu(gpu), load_weights(model))
    return spec, limits, trace, step_model


def run(spec, limits, trace, step_model, policy: str, kv: int, padding: bool = True) -> SimResult:
    pp = plan_for(spec, limits, policy, kv_memory_bytes=kv, trace=trace)
    label = policy if padding else f"{policy} (lazy padding)"
    return simulate(pp.plan, trace, step_model, policy=label, padding=padding)


def row(r: SimResult, groups: list[str]) -> str:
    pages = " / ".join(f"{r.pages[g].total:,}" for g in groups)
    peak = " / ".join(f"{r.pages[g].peak_used / r.pages[g].total:.0%}" for g in groups)
    ttft = r.percentile(r.ttft_s, 50) or 0.0
    return (
        f"| {r.policy} | {pages} | {r.output_tokens_per_s:,.0f} | {r.requests_per_s:.1f} | "
        f"{ttft:.1f} | {(r.percentile(r.tpot_s, 50) or 0) * 1e3:.1f} | {r.preemptions:,} | "
        f"{r.graph_step_share:.1%} | {r.padding_failures} | {peak} |"
    )


def header(groups: list[str]) -> str:
    g = " / ".join(groups)
    return (
        f"| policy | pages ({g}) | output tok/s | req/s | TTFT p50 s | TPOT p50 ms | "
        f"preemptions | graph steps | padding failures | peak used ({g}) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )


def gemma() -> None:
    case = SWEEPS[0]
    spec, limits, trace, model = setup(*case[1:11])
    kv = case[4] * GiB
    groups = spec.group_names
    runs = [run(spec, limits, trace, model, p, kv, pad) for pad in (True, False) for p in ("reference", "typical")]
    print(header(groups))
    for r in runs:
        print(row(r, groups))
    plot_runs(
        OUT / "gemma4_case.png",
        runs,
        title="gemma-4-26b-a4b, B200, FP8 KV 60 GiB, B=256 L=32768 N=8192, azure-conv offline",
    )
    (OUT / "gemma4_case.json").write_text(
        json.dumps(
            {
                "settings": {
                    "model": case[1],
                    "gpu": case[2],
                    "kv_dtype": case[3],
                    "kv_gib": case[4],
                    "B": case[5],
                    "L": case[6],
                    "N": case[7],
                    "typical_S": case[8],
                    "trace": case[9],
                    "rate": "inf",
                },
                "runs": [
                    dict(
                        r.to_json(),
                        padding_failures=r.padding_failures,
                        steps=r.steps,
                        decode_only_steps=r.decode_only_steps,
                    )
                    for r in runs
                ],
            },
            indent=1,
        )
        + "\n"
    )


def sweeps(only: str | None = None) -> None:
    for case in SWEEPS:
        if only and only != case[0]:
            continue
        name, group_arg = case[0], case[11]
        spec, limits, trace, model = setup(*case[1:11])
        kv = case[4] * GiB
        group = resolve_group(spec, group_arg)
        groups = spec.group_names
        runs = [run(spec, limits, trace, model, p, kv) for p in ("reference", "typical", "workload")]
        curve = [(s, run(spec, limits, trace, model, ratio_policy(group, s), kv)) for s in sweep_shares(10, *case[12])]
        best = max([r for _, r in curve] + runs, key=lambda r: r.output_tokens_per_s)
        print(f"\n### {name}: {case[1]} on {case[2]}, {case[9]} ({len(trace)} requests, offline)\n")
        print(header(groups))
        for r in runs + [r for _, r in curve]:
            print(row(r, groups))
        print(
            f"\nbest: {best.policy} ({best.plan.group(group).share:.1%} to {group}), "
            f"{best.output_tokens_per_s:,.0f} tok/s"
        )
        for r in runs:
            print(
                f"- {r.policy}: {r.plan.group(group).share:.1%} to {group}, "
                f"{r.output_tokens_per_s / best.output_tokens_per_s:.1%} of the best"
            )
        plot_runs(
            OUT / f"{name}.png",
            runs,
            sweep_group=group,
            sweep=curve,
            title=f"{case[1]}, {case[2]}, {case[9]} offline: sweep of '{group}' share",
        )
        (OUT / f"{name}.json").write_text(
            json.dumps(
                {
                    "settings": dict(
                        zip(
                            (
                                "case",
                                "model",
                                "gpu",
                                "kv_dtype",
                                "kv_gib",
                                "B",
                                "L",
                                "N",
                                "typical_S",
                                "trace",
                                "max_requests",
                                "group",
                                "range",
                            ),
                            case,
                            strict=True,
                        )
                    ),
                    "runs": [r.to_json() for r in runs + [r for _, r in curve]],
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("gemma", "all"):
        gemma()
    if what in ("sweeps", "all"):
        sweeps()
    elif what != "gemma":
        sweeps(what)
