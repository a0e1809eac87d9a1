"""One interleaved pass over every peer: each peer runs as a worker process in its own venv
(imports once), and for rep in 1..REPS, for each configuration, the peers run one after another
(kvpool-req, kvpool-batch, vllm, vllm-xxh, nano, sglang), each run in a fresh manager after gc.collect().
So machine drift during the pass hits all peers alike. Stdlib only.

usage: python3 orchestrate.py OUT.json [--reps N]
Interpreters come from KV_PY, VLLM_PY, NANO_PY, SGL_PY; NANO_PATH is nano-vllm's minimal package.
kvpool runs from KV_SRC (default: this checkout's src/). With KV_BASE_SRC (another kvpool src/, e.g.
`git archive` of an older commit) the kvpool-base-* peers run it too, interleaved: before vs after.
A peer whose interpreter is missing is left out (and said so)."""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("PEERBENCH", os.path.expanduser("~/.cache/peerbench"))
KV_PY = os.environ.get("KV_PY", f"{ROOT}/venv_kvpool/bin/python")
VLLM_PY = os.environ.get("VLLM_PY", f"{ROOT}/venv_vllm/bin/python")
NANO_PY = os.environ.get("NANO_PY", f"{ROOT}/venv_nano/bin/python")
SGL_PY = os.environ.get("SGL_PY", f"{ROOT}/venv_sgl/bin/python")
NANO_PATH = os.environ.get("NANO_PATH", f"{ROOT}/nanovllm_min")
KV_SRC = os.environ.get("KV_SRC", os.path.abspath(os.path.join(HERE, "..", "..", "src")))
KV_BASE_SRC = os.environ.get("KV_BASE_SRC")

PEERS = [  # the interleaving order
    ("kvpool-req", [KV_PY, "bench_kvpool.py", "--worker"], {"PYTHONPATH": KV_SRC}),
    ("kvpool-batch", [KV_PY, "bench_kvpool.py", "--worker", "--batch"], {"PYTHONPATH": KV_SRC}),
    # kvpool records no events in the rows above, like the peers; this one shows what they cost
    (
        "kvpool-req-ev",
        [KV_PY, "bench_kvpool.py", "--worker"],
        {"PYTHONPATH": KV_SRC, "KV_BENCH_EVENTS": "1", "KV_BENCH_ONLY": "W1 on,W2,W3 on"},
    ),
    *(
        [
            ("kvpool-base-req", [KV_PY, "bench_kvpool.py", "--worker"], {"PYTHONPATH": KV_BASE_SRC}),
            ("kvpool-base-batch", [KV_PY, "bench_kvpool.py", "--worker", "--batch"], {"PYTHONPATH": KV_BASE_SRC}),
        ]
        if KV_BASE_SRC
        else []
    ),
    ("vllm", [VLLM_PY, "bench_vllm.py", "--worker"], {"VLLM_LOGGING_LEVEL": "ERROR"}),
    # vLLM's other prefix_caching_hash_algo (xxh3_128 of pickled blocks); only where hashing runs
    (
        "vllm-xxh",
        [VLLM_PY, "bench_vllm.py", "--worker"],
        {"VLLM_LOGGING_LEVEL": "ERROR", "VLLM_BENCH_HASH": "xxhash", "VLLM_BENCH_ONLY": "W1 on,W2,W3 on"},
    ),
    ("nano", [NANO_PY, "bench_nanovllm.py", "--worker"], {"PYTHONPATH": NANO_PATH}),
    ("sglang", [SGL_PY, "bench_sglang.py", "--worker"], {}),
]
CONFIGS = ["W1 off", "W1 on", "W2", "W3 off", "W3 on", "W1 off batched-prefill"]


def main():
    out_path = sys.argv[1]
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5
    base_env = dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false"
    )
    workers = {}
    missing = [name for name, cmd, _ in PEERS if not os.path.exists(cmd[0])]
    for name in missing:
        print(f"{name}: no interpreter ({dict((n, c[0]) for n, c, _ in PEERS)[name]}), left out", file=sys.stderr)
    peers = [p for p in PEERS if p[0] not in missing]
    for name, cmd, extra in peers:
        err = open(os.path.join(os.path.dirname(os.path.abspath(out_path)), f"worker_{name}.log"), "w")  # noqa: SIM115 (open while the worker runs)
        p = subprocess.Popen(
            cmd,
            cwd=HERE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            bufsize=1,
            env=dict(base_env, **extra),
        )
        workers[name] = p
    result = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "reps": reps,
        "peers": {},
        "errors": [],
        "loadavg": [],
        "left_out": missing,
    }
    for name, p in list(workers.items()):  # imports happen in parallel; wait for each hello
        line = p.stdout.readline()
        if not line:  # the worker died while importing (see its worker_*.log): leave it out
            print(f"{name}: worker failed to start, left out", file=sys.stderr, flush=True)
            p.wait(timeout=60)
            del workers[name]
            missing.append(name)
            peers = [q for q in peers if q[0] != name]
            continue
        hello = json.loads(line)
        result["peers"][name] = {
            "desc": hello["hello"],
            "labels": hello["labels"],
            "runs": {c: [] for c in hello["labels"]},
        }
        print(f"{name}: {hello['hello']}: {hello['labels']}", file=sys.stderr, flush=True)
    t_start = time.time()
    for rep in range(reps):
        for cfg in CONFIGS:
            for name, _, _ in peers:
                peer = result["peers"][name]
                if cfg not in peer["labels"]:
                    continue
                p = workers[name]
                p.stdin.write(cfg + "\n")
                p.stdin.flush()
                res = json.loads(p.stdout.readline())
                if "error" in res:
                    result["errors"].append({"peer": name, "config": cfg, "rep": rep, "error": res["error"]})
                    print(f"ERROR {name} {cfg}: {res['error']}", file=sys.stderr, flush=True)
                else:
                    peer["runs"][cfg].append(res["metrics"])
        result["loadavg"].append(os.getloadavg())
        print(
            f"rep {rep + 1}/{reps} done at {time.time() - t_start:.0f}s, loadavg {os.getloadavg()}",
            file=sys.stderr,
            flush=True,
        )
    for p in workers.values():
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(timeout=60)
    result["seconds"] = time.time() - t_start
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
