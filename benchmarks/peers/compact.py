"""Compact summary for the write-up: per metric and peer, 'pass1 · pass2' wall-clock medians (µs),
and ratios peer/kvpool-req (and peer/kvpool-batch for decode) per pass. Stdlib only.
usage: python3 compact.py pass1.json pass2.json [@cpu]"""

import sys

from report import PEERS as P
from report import fmt, load, med

ROWS = [
    ("W1 off", "admit_us_per_req", "W1 off admission/req (manager calls)"),
    ("W1 off", "admit_incl_construct_us_per_req", "W1 off admission/req incl. request object"),
    ("W1 off", "decode_us_per_step", "W1 off decode step (256 req)"),
    ("W1 off", "free_us_per_req", "W1 off free/req"),
    ("W1 on", "admit_us_per_req", "W1 on admission/req (manager calls)"),
    ("W1 on", "admit_incl_construct_us_per_req", "W1 on admission/req incl. object+hash"),
    ("W1 on", "decode_us_per_step", "W1 on decode step"),
    ("W1 on", "free_us_per_req", "W1 on free/req"),
    ("W2", "admit_incl_hash_us_per_req", "W2 admission/req incl. hashing"),
    ("W2", "admit_us_per_req", "W2 admission/req, manager only"),
    ("W2", "free_us_per_req", "W2 free/req"),
    ("W3 off", "admit_us_per_req", "W3 off admission/req"),
    ("W3 off", "decode_us_per_step", "W3 off decode step"),
    ("W3 on", "admit_incl_construct_us_per_req", "W3 on admission/req incl. object+hash"),
    ("W3 on", "decode_us_per_step", "W3 on decode step"),
    ("W1 off batched-prefill", "admit_us_per_req", "W1 off, 256 prompts in one call, /req"),
]
passes = load([a for a in sys.argv[1:] if not a.startswith("@")])
suf = "@cpu" if "@cpu" in sys.argv else ""
print("| metric | " + " | ".join(P) + " |\n|---|" + "---|" * len(P))
for cfg, m, label in ROWS:
    cells = []
    for p in P:
        v = [med(ps, p, cfg, m + suf) for ps in passes]
        cells.append("—" if v[0] is None else " · ".join(fmt(x) for x in v))
    print(f"| {label} | " + " | ".join(cells) + " |")
print()
print("| ratio peer/kvpool-req (pass1 · pass2) | " + " | ".join(P[1:]) + " |\n|---|" + "---|" * (len(P) - 1))
for cfg, m, label in ROWS:
    base_cfg = "W1 off" if cfg == "W1 off batched-prefill" else cfg
    cells = []
    for p in P[1:]:
        r = []
        for ps in passes:
            b, v = med(ps, "kvpool-req", base_cfg, m + suf), med(ps, p, cfg, m + suf)
            r.append(None if v is None or not b else v / b)
        cells.append("—" if r[0] is None else " · ".join(f"{x:.2f}" for x in r))
    print(f"| {label} | " + " | ".join(cells) + " |")
