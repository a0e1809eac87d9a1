"""How long pool sizing takes: plan_pools on bundled presets, the infeasible
report (B and L searches), --fit, and the Workload policy on a bundled trace.
Prints the median of several runs and the machine."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from kvpool.errors import InfeasiblePlanError
from kvpool.plan import ServingLimits, Workload, plan_pools
from kvpool.presets.traces import load_trace
from kvpool.spec import load_model_spec

GiB = 2**30


def median_ms(fn: Callable[[], object], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def infeasible(spec: object, limits: ServingLimits, budget: int) -> None:
    try:
        plan_pools(spec, limits, kv_memory_bytes=budget)  # type: ignore[arg-type]
    except InfeasiblePlanError:
        return
    raise AssertionError("expected an infeasible plan")


def main() -> None:
    gemma = load_model_spec("gemma-4-26b-a4b", kv_dtype="fp8")
    v4 = load_model_spec("deepseek-v4-flash")
    g_lim = ServingLimits(max_batch_size=256, max_seq_len=32768, max_num_tokens=8192)
    v4_lim = ServingLimits(max_batch_size=256, max_seq_len=1_048_576, max_num_tokens=8192)
    trace = load_trace("mooncake-conv")
    pairs = np.stack([trace.prompt_len, trace.output_len], axis=1)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("gemma-4 reference ratio, 60 GiB", lambda: plan_pools(gemma, g_lim, kv_memory_bytes=60 * GiB)),
        ("deepseek-v4 typical step + floors, L=1M, 120 GiB", lambda: plan_pools(v4, v4_lim, kv_memory_bytes=120 * GiB)),
        ("deepseek-v4 infeasible report (B and L searches), 8 GiB", lambda: infeasible(v4, v4_lim, 8 * GiB)),
        (
            "deepseek-v4 --fit, B=8, 4 GiB",
            lambda: plan_pools(
                v4, ServingLimits(max_batch_size=8, max_seq_len=1_048_576), kv_memory_bytes=4 * GiB, fit=True
            ),
        ),
        (
            f"gemma-4 Workload ratio, mooncake-conv ({len(trace)} requests)",
            lambda: plan_pools(gemma, g_lim, kv_memory_bytes=60 * GiB, policy=Workload(pairs)),
        ),
    ]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    for name, fn in cases:
        print(f"{median_ms(fn):9.2f} ms  {name}")


if __name__ == "__main__":
    main()
