"""How long the simulator takes to replay the full Azure chat trace (19,366
requests) for a full-attention 8B model (Llama-3.1-8B, H100, 40 GiB of KV,
B = 256, L = 8192, N = 8192): at the trace's own arrival times and offline
(--rate inf). Also a hybrid model (Gemma 4 26B-A4B, the issue's Gemma case)
offline. Prints the median wall time of a few runs, steps per second, and the
machine. Target: under a minute per replay on the 2-core CI machine.

    PYTHONPATH=src python benchmarks/bench_sim.py [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time

from kvpool.plan import ServingLimits, plan_pools
from kvpool.presets import load_gpu
from kvpool.presets.traces import load_trace
from kvpool.sim import SimResult, StepTimeModel, load_weights, simulate
from kvpool.spec import load_model_spec

GiB = 2**30


def replay(
    model: str, gpu: str, kv_dtype: str, kv_gib: int, max_seq_len: int, rate: float | None, max_requests: int | None
) -> SimResult:
    spec = load_model_spec(model, kv_dtype=kv_dtype, max_seq_len=max_seq_len)
    limits = ServingLimits(max_batch_size=256, max_seq_len=max_seq_len, max_num_tokens=8192)
    plan = plan_pools(spec, limits, kv_memory_bytes=kv_gib * GiB)
    step_model = StepTimeModel.build(plan.spec, load_gpu(gpu), load_weights(model))
    trace = load_trace("azure-conv", max_requests=max_requests).with_rate(rate)
    return simulate(plan, trace, step_model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="first 2,000 requests only")
    args = ap.parse_args()
    n = 2000 if args.quick else None
    cases = [
        ("llama-3.1-8b-instruct", "h100", "auto", 40, 8192, None, "trace times"),
        ("llama-3.1-8b-instruct", "h100", "auto", 40, 8192, math.inf, "rate inf"),
        ("gemma-4-26b-a4b", "b200", "fp8", 60, 32768, math.inf, "rate inf"),
    ]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}"
    )
    print(f"{'case':<44} {'requests':>8} {'steps':>8} {'median s':>9} {'steps/s':>9} {'sim tok/s':>10}")
    for model, gpu, dtype, gib, seq, rate, label in cases:
        walls = []
        result = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = replay(model, gpu, dtype, gib, seq, rate, n)
            walls.append(time.perf_counter() - t0)
        assert result is not None
        wall = statistics.median(walls)
        name = f"{model} {gpu} {label}"
        print(
            f"{name:<44} {result.num_requests:>8} {result.steps:>8} {wall:>9.2f} "
            f"{result.steps / wall:>9,.0f} {result.output_tokens_per_s:>10,.0f}"
        )


if __name__ == "__main__":
    main()
