"""Shared synthetic workloads, aggregation and the worker protocol for the peer KV-manager
micro-benchmarks (W1/W2 as in steering research/peer-bench-feasibility.md, plus W3).

Each bench_*.py defines CONFIGS: label -> zero-arg callable returning a dict of metrics (floats)
and checks (ints / floats). Run standalone (`python bench_x.py`, median of REPS) or as a worker
(`python bench_x.py --worker`) driven by orchestrate.py, which interleaves the peers.
"""

import gc
import json
import os
import statistics
import sys
import time

BS = 16
W1_REQS, W1_PROMPT, W1_STEPS = 256, 1000, 200
W2_REQS, W2_SHARED, W2_UNIQUE = 256, 4096, 256
W3_WINDOW = 512  # W3 = W1 on a full-attention + sliding-window(512) model

now = time.perf_counter_ns


def stamp():
    """(wall ns, process CPU ns): CPU time is less sensitive to other work on a shared machine."""
    return time.perf_counter_ns(), time.process_time_ns()


def begin():
    """gc.collect(), then stamp(): each timed phase starts without the setup's (or the previous
    phase's) garbage pending, so a full collection of it does not land inside the phase."""
    gc.collect()
    return stamp()


def put(d, key, a, b, div):
    """d[key] = wall us / div between stamps a and b; d[key + '@cpu'] = the same in CPU time."""
    d[key] = (b[0] - a[0]) / 1e3 / div
    d[key + "@cpu"] = (b[1] - a[1]) / 1e3 / div


def w1_prompt(i):
    base = 1_000_000 + i * 10_000
    return list(range(base, base + W1_PROMPT))


def w1_decode_token(i, step):
    return 1_000_000 + i * 10_000 + W1_PROMPT + step


def w2_prompt(i):
    shared = list(range(5_000_000, 5_000_000 + W2_SHARED))
    base = 9_000_000 + i * W2_UNIQUE
    return shared + list(range(base, base + W2_UNIQUE))


def cdiv(a, b):
    return -(-a // b)


def w1_blocks_needed():
    return W1_REQS * cdiv(W1_PROMPT + W1_STEPS, BS)


def w2_blocks_needed():
    return W2_SHARED // BS + W2_REQS * cdiv(W2_UNIQUE, BS)


# ---- expected block counts (checked while timing) -------------------------------------------
W1_BLOCKS_AFTER_ADMIT = W1_REQS * cdiv(W1_PROMPT, BS)  # 256 * 63 = 16128
W1_BLOCKS_AFTER_DECODE = W1_REQS * cdiv(W1_PROMPT + W1_STEPS, BS)  # 256 * 75 = 19200
W2_BLOCKS_AFTER_ADMIT = w2_blocks_needed()  # 256 + 256*16 = 4352
W2_HIT_RATE = (W2_REQS - 1) * W2_SHARED / (W2_REQS * (W2_SHARED + W2_UNIQUE))  # 0.9375


def sliding_live_blocks(num_tokens, computed):
    """Blocks a sliding(W3_WINDOW) layer keeps for a request with `num_tokens` slots of which
    `computed` are computed: the in-flight token at position `computed` attends to positions
    >= computed + 1 - W, so blocks before (computed + 1 - W) // BS are dropped."""
    return cdiv(num_tokens, BS) - max(0, (computed + 1 - W3_WINDOW) // BS)


# sliding group: every prompt is fully allocated at admission (nothing computed yet), and at the
# end of decode each request has 1200 slots with 1199 computed.
W3_SLIDING_AFTER_ADMIT = W1_REQS * cdiv(W1_PROMPT, BS)  # 16128
W3_SLIDING_AFTER_DECODE = W1_REQS * sliding_live_blocks(W1_PROMPT + W1_STEPS, W1_PROMPT + W1_STEPS - 1)  # 256*32
W3_BLOCKS_AFTER_ADMIT = W1_BLOCKS_AFTER_ADMIT + W3_SLIDING_AFTER_ADMIT  # 32256
W3_BLOCKS_AFTER_DECODE = W1_BLOCKS_AFTER_DECODE + W3_SLIDING_AFTER_DECODE  # 19200 + 8192
W3_SLIDING_POOL = W3_SLIDING_AFTER_ADMIT + 64  # peak of the sliding group is right after admission
W3_SHARED_POOL = w1_blocks_needed() + W3_SLIDING_POOL  # one shared pool (vLLM hybrid / SGLang)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def _fmt(v):
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def run_reps(name, fns, reps=5):
    """Standalone: every label `reps` times in a fresh manager, gc.collect() between; medians."""
    out = {"peer": name, "reps": reps, "results": {}}
    for label, fn in fns.items():
        runs = []
        for _ in range(reps):
            gc.collect()
            runs.append(fn())
        keys = runs[0].keys()
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        out["results"][label] = {"median": med, "runs": runs}
        print(f"[{name}] {label}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in med.items()), file=sys.stderr, flush=True)
    print(json.dumps(out))
    return out


def serve(name, fns):
    """Worker loop: one label per stdin line -> one JSON line per run on the protocol fd.
    Library output that goes to fd 1 is moved to stderr so it cannot corrupt the protocol."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    proto.write(json.dumps({"hello": name, "labels": list(fns)}) + "\n")
    for line in sys.stdin:
        label = line.strip()
        if not label:
            continue
        if label == "quit":
            break
        try:
            gc.collect()
            res = {"label": label, "metrics": fns[label]()}
        except Exception as e:  # reported, the orchestrator records the failure
            import traceback

            traceback.print_exc()
            res = {"label": label, "error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(res) + "\n")


def main(name, fns):
    if "--worker" in sys.argv:
        serve(name, fns)
    else:
        only = [a for a in sys.argv[1:] if not a.startswith("-")]
        run_reps(name, {k: v for k, v in fns.items() if not only or k in only})
