"""Tables from orchestrate.py passes: medians [min-max] (us), ratios peer/kvpool, and the
configurations whose medians differ by more than 20% between passes. Stdlib only.
usage: python3 report.py pass1.json [pass2.json ...] > report.md"""

import json
import statistics
import sys

PEERS = [
    "kvpool-req",
    "kvpool-batch",
    "kvpool-req-ev",
    "kvpool-base-req",
    "kvpool-base-batch",
    "vllm",
    "vllm-xxh",
    "nano",
    "sglang",
]
ROWS = [  # (config, metric, label)
    ("W1 off", "admit_us_per_req", "W1 off: admission / req (manager calls)"),
    ("W1 off", "admit_incl_construct_us_per_req", "W1 off: admission / req incl. request object"),
    ("W1 off", "decode_us_per_step", "W1 off: decode step, 256 reqs"),
    ("W1 off", "free_us_per_req", "W1 off: free / req"),
    ("W1 on", "admit_us_per_req", "W1 on: admission / req (manager calls)"),
    ("W1 on", "admit_incl_construct_us_per_req", "W1 on: admission / req incl. request object (+hash)"),
    ("W1 on", "decode_us_per_step", "W1 on: decode step, 256 reqs"),
    ("W1 on", "free_us_per_req", "W1 on: free / req"),
    ("W2", "admit_incl_hash_us_per_req", "W2: admission / req incl. hashing"),
    ("W2", "admit_us_per_req", "W2: admission / req, manager calls only"),
    ("W2", "free_us_per_req", "W2: free / req"),
    ("W3 off", "admit_us_per_req", "W3 off: admission / req"),
    ("W3 off", "decode_us_per_step", "W3 off: decode step, 256 reqs"),
    ("W3 off", "free_us_per_req", "W3 off: free / req"),
    ("W3 on", "admit_us_per_req", "W3 on: admission / req"),
    ("W3 on", "admit_incl_construct_us_per_req", "W3 on: admission / req incl. request object (+hash)"),
    ("W3 on", "decode_us_per_step", "W3 on: decode step, 256 reqs"),
    ("W3 on", "free_us_per_req", "W3 on: free / req"),
    ("W1 off batched-prefill", "admit_us_per_req", "W1 off: all 256 prompts in one alloc call / req"),
]
# where a peer does request construction / hashing inside the manager calls, the two rows coincide
ALIASES = {"admit_incl_construct_us_per_req": "admit_us_per_req", "admit_us_per_req": "admit_incl_hash_us_per_req"}
CHECKS = ["hit_rate", "blocks_after_admit", "blocks_after_decode", "blocks_leaked", "swa_evicted_positions"]


def load(paths):
    return [json.load(open(p)) for p in paths]


def values(pass_, peer, cfg, metric):
    p = pass_["peers"].get(peer)
    if not p or cfg not in p["runs"] or not p["runs"][cfg]:
        return None
    runs = p["runs"][cfg]
    m = metric
    if m not in runs[0]:
        m = ALIASES.get(metric.replace("@cpu", ""), "") + ("@cpu" if metric.endswith("@cpu") else "")
        if m not in runs[0]:
            return None
    return [r[m] for r in runs]


def fmt(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def cell(vals):
    if vals is None:
        return "—"
    return f"{fmt(statistics.median(vals))} [{fmt(min(vals))}–{fmt(max(vals))}]"


def table(pass_, suffix=""):
    out = ["| metric (µs) | " + " | ".join(PEERS) + " |", "|---|" + "---|" * len(PEERS)]
    for cfg, metric, label in ROWS:
        cells = [cell(values(pass_, peer, cfg, metric + suffix)) for peer in PEERS]
        if all(c == "—" for c in cells):
            continue
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def med(pass_, peer, cfg, metric):
    v = values(pass_, peer, cfg, metric)
    return None if v is None else statistics.median(v)


def ratios(pass_, base, suffix=""):
    others = [p for p in PEERS if p != base]
    out = [f"| peer / {base} | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
    for cfg, metric, label in ROWS:
        b = med(pass_, base, cfg if cfg != "W1 off batched-prefill" else "W1 off", metric + suffix)
        cells = []
        for peer in others:
            v = med(pass_, peer, cfg, metric + suffix)
            cells.append("—" if v is None or not b else f"{v / b:.2f}")
        if all(c == "—" for c in cells):
            continue
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def checks(passes):
    out = ["| config | peer | " + " | ".join(CHECKS) + " |", "|---|---|" + "---|" * len(CHECKS)]
    for cfg in dict.fromkeys(c for c, _, _ in ROWS):
        for peer in PEERS:
            seen = {}
            for ps in passes:
                p = ps["peers"].get(peer)
                if not p or not p["runs"].get(cfg):
                    continue
                for k in CHECKS:
                    for r in p["runs"][cfg]:
                        if k in r:
                            seen.setdefault(k, set()).add(round(r[k], 6))
            if seen:
                out.append(
                    f"| {cfg} | {peer} | "
                    + " | ".join(",".join(str(x) for x in sorted(seen[k])) if k in seen else "" for k in CHECKS)
                    + " |"
                )
    return "\n".join(out)


def drift(passes, suffix=""):
    out = []
    for cfg, metric, label in ROWS:
        for peer in PEERS:
            ms = [med(ps, peer, cfg, metric + suffix) for ps in passes]
            if any(m is None for m in ms):
                continue
            lo, hi = min(ms), max(ms)
            if lo > 0 and (hi - lo) / lo > 0.20:
                out.append(
                    f"- {label} / {peer}: " + " vs ".join(fmt(m) for m in ms) + f" ({(hi - lo) / lo * 100:.0f}% apart)"
                )
    return "\n".join(out) or "- none"


def main():
    passes = load(sys.argv[1:])
    for i, ps in enumerate(passes, 1):
        print(
            f"## Pass {i} (started {ps['started']}, {ps['reps']} reps, {ps['seconds']:.0f} s, "
            f"loadavg after each rep: {', '.join(f'{la[0]:.1f}' for la in ps['loadavg'])})\n"
        )
        for name, p in ps["peers"].items():
            print(f"- {name}: {p['desc']}")
        if ps["errors"]:
            print(f"\nERRORS: {ps['errors']}")
        print("\n### Wall-clock medians [min–max]\n")
        print(table(ps))
        print("\n### Ratios (wall-clock medians)\n")
        print(ratios(ps, "kvpool-req"))
        print()
        print(ratios(ps, "kvpool-batch"))
        print("\n### Process-CPU-time medians [min–max]\n")
        print(table(ps, "@cpu"))
        print("\n### Ratios (CPU-time medians) vs kvpool-req\n")
        print(ratios(ps, "kvpool-req", "@cpu"))
        print()
    print("## Correctness checks (all runs, all passes: distinct values seen)\n")
    print(checks(passes))
    if len(passes) > 1:
        print("\n## Pass-to-pass differences > 20% (wall-clock medians)\n")
        print(drift(passes))
        print("\n## Pass-to-pass differences > 20% (CPU-time medians)\n")
        print(drift(passes, "@cpu"))


if __name__ == "__main__":
    main()
