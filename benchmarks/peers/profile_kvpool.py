"""cProfile of kvpool's per-request paths: W1 decode (one resize per request per step, caching
off and on), W2 admission (create + resize + resize + commit) and W3 decode (caching off and on).
Only the profiled phase runs under the profiler; the setup (admissions before the decode) does not.
usage: python profile_kvpool.py [N_TOP]   (prints top functions by cumulative and by own time)"""

import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kvpool as B
from common import *

TOP = int(sys.argv[1]) if len(sys.argv) > 1 else 12
L, S = W1_PROMPT, W1_STEPS


def show(prof, title):
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s).strip_dirs().sort_stats(key)
        st.print_stats(TOP)
        body = s.getvalue()
        body = body[body.find("   ncalls") :]
        print(f"=== {title} — sorted by {key}\n{body}")


def w1_decode(caching, sliding=False):
    pages = {"full": w1_blocks_needed() + 64}
    if sliding:
        pages["sliding"] = W3_SLIDING_POOL
    m = B.make(pages, caching, sliding)
    rids = list(range(W1_REQS))
    for rid in rids:
        hit = m.create(rid, w1_prompt(rid))
        assert m.resize(rid, L, hit)
        if caching:
            assert m.resize(rid, L, L)
            m.commit(rid, L)
    resize, commit = m.resize, m.commit

    def decode():
        for step in range(1, S + 1):
            cap, hist = L + step, L + step - 1
            if caching and step >= 2:
                for rid in rids:
                    resize(rid, cap, hist)
                    commit(rid, hist, (w1_decode_token(rid, step - 2),))
            else:
                for rid in rids:
                    resize(rid, cap, hist)

    prof = cProfile.Profile()
    prof.runcall(decode)
    show(
        prof,
        f"{'W3' if sliding else 'W1'} caching={'on' if caching else 'off'}: per-request decode, {S} steps x {W1_REQS}",
    )


def w2_admission():
    m = B.make({"full": w2_blocks_needed() + 64}, True)
    prompts = [w2_prompt(i) for i in range(W2_REQS)]
    n = W2_SHARED + W2_UNIQUE

    def admit():
        for rid, p in enumerate(prompts):
            hit = m.create(rid, p)
            m.resize(rid, n, hit)
            m.resize(rid, n, n)
            m.commit(rid, n)

    prof = cProfile.Profile()
    prof.runcall(admit)
    show(prof, f"W2 admission, {W2_REQS} requests")


if __name__ == "__main__":
    w1_decode(False)
    w1_decode(True)
    w2_admission()
    w1_decode(False, sliding=True)
    w1_decode(True, sliding=True)
