"""Reference engine throughput: generated tokens per second for the tiny models
on CPU (8 requests, 48-token prompts, 64 new tokens, 16-token pages), and on a
CUDA device eager vs CUDA-graph decode throughput. Prints medians of
`--repeats` runs and the machine.

    python benchmarks/bench_engine.py [--repeats 3] [--archs llama,gemma3] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from kvpool.engine.runner import Engine
from kvpool.engine.weights import tiny_model
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import load_model_spec, pages_per_group

BATCH, PROMPT, NEW, TPB = 8, 48, 64, 16


def engine_for(model: torch.nn.Module, config: dict[str, object], graphs: bool, speculate: int) -> Engine:
    spec = load_model_spec(config, kv_dtype="fp32", tokens_per_block=TPB)
    limits = ServingLimits(max_batch_size=BATCH, max_seq_len=PROMPT + NEW + 8, max_num_tokens=512,
                           max_draft_len=speculate)
    pages = pages_per_group(spec, [(PROMPT + NEW + speculate, 0)] * (BATCH + 2))
    # Reuse off: every run recomputes its prompts, so runs are comparable.
    return Engine(model, PoolPlan.from_pages(spec, pages, limits), speculate=speculate,  # type: ignore[arg-type]
                  cuda_graphs=graphs, enable_reuse=False)


def run_once(engine: Engine, seed: int) -> tuple[float, float]:
    """(tokens/s over the whole run, decode-only tokens/s)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 256, (PROMPT,), generator=g).tolist() for _ in range(BATCH)]
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    for p in prompts:
        engine.add(p, NEW)  # no EOS: every request generates NEW tokens
    sync()
    start = time.perf_counter()
    engine.step()  # the whole batch prefills in one step (8 x 48 <= 512)
    sync()
    prefill_done = time.perf_counter()
    engine.run()
    sync()
    end = time.perf_counter()
    tokens = BATCH * NEW
    return tokens / (end - start), (tokens - BATCH) / (end - prefill_done)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--archs", default="llama,qwen3,mistral,gemma3")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print(f"workload: {BATCH} requests x {PROMPT}-token prompts, {NEW} new tokens, {TPB}-token pages, "
          f"float32; median of {args.repeats}")
    modes = [("eager", False, 0), ("eager+spec3", False, 3)]
    # With cuda_graphs=True a CPU engine runs the same static-buffer decode path
    # eagerly; on CUDA it captures and replays graphs.
    modes.append(("cuda-graph" if args.device == "cuda" else "static-cpu", True, 0))
    print(f"{'arch':8} {'mode':12} {'tokens/s':>10} {'decode tokens/s':>16}")
    for arch in args.archs.split(","):
        model, _, config = tiny_model(arch)
        model = model.to(args.device)
        for name, graphs, spec in modes:
            engine = engine_for(model, config, graphs, spec)
            run_once(engine, 0)  # warm-up (and graph capture)
            runs = [run_once(engine, 1 + i) for i in range(args.repeats)]
            total = statistics.median(r[0] for r in runs)
            decode = statistics.median(r[1] for r in runs)
            print(f"{arch:8} {name:12} {total:10.0f} {decode:16.0f}")


if __name__ == "__main__":
    main()
