"""KVCacheManager hot paths: admission and batched decode steps.

W1: 256 requests with 1,000-token prompts, then 200 decode steps of +1 token
    each (`extend`), 16-token pages, full attention only.
W2: W1 with a 4,096-token system prompt shared by every request, reuse on
    (the first request computes and commits it; the rest hit it).
W3: W1 on a full + sliding-window (W=512) model.
W1/W3 are also timed with one `resize` call per request per step (the
single-request path a scheduler uses), for comparison with `extend`.

An admission is `create(rid, prompt)` + `resize(rid, len, hit)` (the prefill
chunk) + `resize(rid, len + 1, len)` + `commit(rid, len)`. Prints median and
p99 microseconds per admission and per 256-request decode step (and the mean
step: all 256 prompts have the same length, so every 16th step crosses a page
boundary in every request at once and makes the p99), and the machine. Run: `python benchmarks/bench_manager.py [--repeat N]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import load_model_spec

BATCH, PROMPT, STEPS, TPB = 256, 1000, 200, 16


def spec(sliding: bool):  # type: ignore[no-untyped-def]
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "hidden_size": 1024,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "bfloat16",
    }
    if sliding:
        config |= {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 512}
    return load_model_spec(config, tokens_per_block=TPB)


def run(name: str, sliding: bool, shared: int, reuse: bool, single: bool = False) -> dict[str, float]:
    s = spec(sliding)
    per_request = -(-(shared + PROMPT + STEPS + 1) // TPB)
    pages = {g.name: BATCH * per_request + 64 for g in s.groups}
    limits = ServingLimits(max_batch_size=BATCH, max_seq_len=8192)
    m = KVCacheManager(PoolPlan.from_pages(s, pages, limits), enable_reuse=reuse)
    rng = np.random.default_rng(0)
    system = rng.integers(0, 50_000, shared).tolist()
    admit_us, hits = [], 0
    for rid in range(BATCH):
        tokens = system + rng.integers(0, 50_000, PROMPT).tolist()
        t0 = time.perf_counter()
        hit = m.create(rid, tokens)
        ok = bool(m.resize(rid, len(tokens), hit)) and bool(m.resize(rid, len(tokens) + 1, len(tokens)))
        m.commit(rid, len(tokens))
        admit_us.append((time.perf_counter() - t0) * 1e6)
        assert ok, "pool too small"
        hits += hit
    rids = list(range(BATCH))
    step_us = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        if single:  # one `resize` per request, as a scheduler without the batch path does
            ok = all([bool(m.resize(r, m.capacity(r) + 1, m.history(r) + 1)) for r in rids])
        else:
            ok = bool(m.extend(rids, 1))
        step_us.append((time.perf_counter() - t0) * 1e6)
        assert ok
    m.check_integrity()
    return {
        "admit_median": float(np.median(admit_us)),
        "admit_p99": float(np.percentile(admit_us, 99)),
        "step_median": float(np.median(step_us)),
        "step_p99": float(np.percentile(step_us, 99)),
        "step_mean": float(np.mean(step_us)),
        "hit_tokens": hits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload; the best median is kept")
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, NumPy {np.__version__}"
    )
    print(f"{BATCH} requests x {PROMPT}-token prompts, {STEPS} decode steps, {TPB}-token pages")
    print(
        f"{'workload':<34} {'admit med':>10} {'admit p99':>10} {'step med':>9} {'step p99':>9} {'step mean':>9}  (us)"
    )
    workloads = [
        ("W1 full attention", False, 0, False, False),
        ("W2 + 4096 shared prompt, reuse", False, 4096, True, False),
        ("W3 full + sliding(512)", True, 0, False, False),
        ("W1 via 256 resize() calls", False, 0, False, True),
        ("W3 via 256 resize() calls", True, 0, False, True),
    ]
    for name, sliding, shared, reuse, single in workloads:
        best = min(
            (run(name, sliding, shared, reuse, single) for _ in range(args.repeat)), key=lambda r: r["step_median"]
        )
        extra = f"  hit tokens {int(best['hit_tokens'])}" if reuse else ""
        print(
            f"{name:<34} {best['admit_median']:>10.1f} {best['admit_p99']:>10.1f} "
            f"{best['step_median']:>9.1f} {best['step_p99']:>9.1f} {best['step_mean']:>9.1f}{extra}"
        )


if __name__ == "__main__":
    main()
