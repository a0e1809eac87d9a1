"""kvpool's simulator against NVIDIA Dynamo's mocker, the anchor of a fast
trace replay: the CPU seconds each takes to replay the same Mooncake
conversation requests with the same pool.

Both read one Mooncake JSONL file, written at run time to a temporary folder
from the bundled `mooncake-conv` trace (`write_mooncake_jsonl`): its first N
requests, and for N past its 12,031 requests the trace followed by its own
first requests again, re-timed after it (`concat_traces`). Both replay it at
the trace's own arrival times, as one engine with the same pages:

- kvpool: `kvpool simulate MODEL --gpu GPU --kv-memory SIZE --max-seq-len L
  --tokens-per-block 32 --max-batch-size 256 --max-num-tokens 8192 --trace FILE --json`;
- the mocker: `dynamo._core.run_mocker_trace_replay([FILE], extra_engine_args=
  {"engine": {"block_size": 32, "num_gpu_blocks": P, "max_num_seqs": 256,
  "max_num_batched_tokens": 8192}}, num_workers=1, trace_block_size=512)`,
  P being the pages kvpool's plan gave the pool (read from its JSON), in the
  side venv `make dynamo-venv` builds (ai-dynamo-runtime 1.6.1, CPU wheel).

Each run is its own process, timed from its start to its exit (its user + system
CPU seconds, the operating system's accounting of the child: interpreter start
and imports included on both sides); the two alternate, kvpool first, `--repeat`
times per size. Each kvpool tree runs from bytecode compiled before the first
timed run (an untimed run on 20 requests fills a temporary `PYTHONPYCACHEPREFIX`),
as an installed package does (pip compiles it) and as the mocker's side venv
already does: with `PYTHONDONTWRITEBYTECODE` set, a source tree would otherwise
be compiled again at every start (about 0.5 s of its CPU seconds here).
Prints per size the median CPU seconds of each and their ratio (and the median of the ratios pair by pair), what each simulated (finished
requests, prefix reuse, output tokens/s: their step-time models differ, so only
the work is alike), the growth from 2K to 4K requests, and the machine.

    python benchmarks/bench_vs_mocker.py [--sizes 1000,2000,4000,16000] [--repeat 3]
        [--dynamo-venv ~/.cache/kvpool-engines/dynamo-1.6.1] [--baseline DIR]

`--baseline DIR` also runs the kvpool of another source tree (DIR/src first
on PYTHONPATH; e.g. `git archive main | tar -x -C DIR`) in the same rounds,
so that a change is measured against what it changes, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvpool.presets.traces import load_trace, write_mooncake_jsonl
from kvpool.trace import Trace, concat_traces

BLOCK, BATCH, TOKENS = 32, 256, 8192
CACHE = Path(os.environ.get("KVPOOL_ENGINES_CACHE", Path.home() / ".cache" / "kvpool-engines"))

MOCKER = """
import json, sys
from dynamo._core import run_mocker_trace_replay
engine = json.loads(sys.argv[2])
r = run_mocker_trace_replay([sys.argv[1]], extra_engine_args={"engine": engine}, num_workers=1,
                            router_mode="round_robin", trace_block_size=512)
keys = ("completed_requests", "prefix_cache_reused_ratio", "output_throughput_tok_s", "duration_ms")
print(json.dumps({k: r.summary.get(k) for k in keys}))
"""


def trace_of(n: int) -> Trace:
    """The first `n` Mooncake conversation requests, the trace repeated past its end."""
    whole = load_trace("mooncake-conv")
    parts = [whole] * (n // len(whole)) + ([whole.head(n % len(whole))] if n % len(whole) else [])
    return parts[0] if len(parts) == 1 else concat_traces(parts, f"mooncake-conv x{n}")


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run `cmd` to its end: (its user + system CPU seconds, its stdout); raises when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{cmd[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, done.stdout


def bytecode_env(src: Path | None, cache: Path, args: argparse.Namespace) -> dict[str, str]:
    """The environment of a kvpool run from the source tree `src` (None: the
    installed kvpool), its bytecode cached in `cache`: filled now by one
    untimed run on a few requests, which compiles every module a run imports
    (kvpool's and its dependencies': the prefix holds them all)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    if src is not None:
        env["PYTHONPATH"] = str(src / "src")
    path = cache.parent / f"{cache.name}.jsonl"
    write_mooncake_jsonl(trace_of(20), path)
    kvpool(path, args, env)
    return env


def kvpool(path: Path, args: argparse.Namespace, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """kvpool's run, in `env` (`bytecode_env`: the installed kvpool or a source tree)."""
    cmd = [sys.executable, "-m", "kvpool", "simulate", args.model, "--gpu", args.gpu, "--kv-memory", args.kv_memory]
    cmd += ["--max-seq-len", str(args.max_seq_len), "--tokens-per-block", str(BLOCK)]
    cmd += ["--max-batch-size", str(BATCH), "--max-num-tokens", str(TOKENS), "--trace", str(path), "--json", "--quiet"]
    cpu, out = timed(cmd, env)
    run: dict[str, Any] = json.loads(out)["runs"][0]
    return cpu, run


def mocker(path: Path, pages: int, python: Path) -> tuple[float, dict[str, Any]]:
    engine = {"block_size": BLOCK, "num_gpu_blocks": pages, "max_num_seqs": BATCH, "max_num_batched_tokens": TOKENS}
    env = {**os.environ, "RUST_LOG": "off"}
    cpu, out = timed([str(python), "-c", MOCKER, str(path), json.dumps(engine)], env)
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return cpu, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,4000,16000", help="request counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each per size (medians)")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--kv-memory", default="16GiB")
    ap.add_argument("--max-seq-len", type=int, default=40960)
    ap.add_argument("--dynamo-venv", type=Path, default=CACHE / "dynamo-1.6.1", help="made by `make dynamo-venv`")
    ap.add_argument("--baseline", type=Path, help="a kvpool source tree to run as well (its src/ on PYTHONPATH)")
    args = ap.parse_args()
    python = args.dynamo_venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no Dynamo side venv at {args.dynamo_venv}: run `make dynamo-venv` (or pass --dynamo-venv)")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}; mocker: ai-dynamo-runtime 1.6.1 ({args.dynamo_venv.name})"
    )
    print(
        f"kvpool simulate {args.model} --gpu {args.gpu} --kv-memory {args.kv_memory} --max-seq-len {args.max_seq_len} "
        f"--tokens-per-block {BLOCK} --max-batch-size {BATCH} --max-num-tokens {TOKENS} --trace <N Mooncake requests>"
    )
    base = f" {'baseline s':>10} {'ratio':>6}" if args.baseline else ""
    header = f"{'requests':>8}{base} {'kvpool cpu s':>12} {'mocker cpu s':>12} {'ratio':>6} {'paired':>6}   simulated"
    print(header)
    medians: dict[int, tuple[float, float]] = {}
    baselines: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours_env = bytecode_env(None, Path(tmp) / "pycache", args)
        base_env = bytecode_env(args.baseline, Path(tmp) / "pycache-baseline", args) if args.baseline else ours_env
        for n in sizes:
            path = Path(tmp) / f"mooncake-{n}.jsonl"
            write_mooncake_jsonl(trace_of(n), path)
            ours: list[float] = []
            theirs: list[float] = []
            before: list[float] = []
            for i in range(args.repeat):
                if args.baseline:
                    before.append(kvpool(path, args, base_env)[0])
                cpu, run = kvpool(path, args, ours_env)
                pages = sum(g["total"] for g in run["pages"].values())
                ours.append(cpu)
                cpu, summary = mocker(path, pages, python)
                theirs.append(cpu)
                was = f"baseline {before[-1]:.2f} s, " if before else ""
                print(f"  {n} requests, run {i + 1}: {was}kvpool {ours[-1]:.2f} s, mocker {cpu:.2f} s", file=sys.stderr)
            a, b = statistics.median(ours), statistics.median(theirs)
            paired = statistics.median(x / y for x, y in zip(ours, theirs, strict=True))
            medians[n] = (a, b)
            if before:
                baselines[n] = statistics.median(before)
            was = f" {baselines[n]:>10.2f} {baselines[n] / b:>6.1f}" if before else ""
            print(
                f"{n:>8}{was} {a:>12.2f} {b:>12.2f} {a / b:>6.1f} {paired:>6.1f}   "
                f"kvpool {run['finished']} done, prompt reuse {run['prompt_hit_rate']:.2f}, "
                f"{run['output_tokens_per_s']:,.0f} tok/s; mocker {summary['completed_requests']} done, "
                f"prompt reuse {summary['prefix_cache_reused_ratio']:.2f}, {summary['output_throughput_tok_s']:,.0f} tok/s "
                f"({pages} pages of {BLOCK})"
            )
    if 2000 in medians and 4000 in medians:
        (a2, b2), (a4, b4) = medians[2000], medians[4000]
        print(f"4,000 / 2,000 requests: kvpool {a4 / a2:.2f}x, mocker {b4 / b2:.2f}x the CPU seconds")
        if 2000 in baselines and 4000 in baselines:
            print(f"4,000 / 2,000 requests, baseline: {baselines[4000] / baselines[2000]:.2f}x")


if __name__ == "__main__":
    main()
