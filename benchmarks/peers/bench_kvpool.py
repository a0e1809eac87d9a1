"""Drive kvpool's KVCacheManager (src/kvpool/cache/manager.py) with W1/W2/W3.

Two ways of calling it, reported as separate peers:
  (default)    per-request API: create / resize / commit / advance / free, one call per request
                per decode step: resize at step 1, then advance(rid, token), the decode step in one
                call (with caching on it commits the new token, so pages become reusable as they
                fill, as vLLM and nano-vllm register them; advance == resize + commit, property-
                tested in tests/test_cache_advance.py)
  --batch      batched API: one resize_many for all 256 admissions, then per decode step one
                resize_many (step 1) or extend(rids, 1) (steps 2..200); with caching on, the
                generated tokens are committed once at the end (resize + commit before free),
                which is what kvpool's own Scheduler does (sched/scheduler.py _commit_computed).

Events: off (`events=False`), like the peers' rows: vLLM's harness leaves enable_kv_cache_events at
its default False, nano-vllm and SGLang's allocator record none. KV_BENCH_EVENTS=1 turns kvpool's
on (the orchestrator's kvpool-req-ev peer, on the workloads that store pages: their cost).
KV_BENCH_ONLY="W1 on,W2" runs only those workloads.

Shapes (capacity, history) follow the peers' slot counts exactly:
  admission   create(rid, prompt) -> hit; resize(rid, L, hit)        (slots for the prompt)
              caching on: resize(rid, L, L) + commit(rid, L)        (prompt computed, pages stored)
  decode s    resize(rid, L+s, L+s-1)                               (1 more slot; s=1..200)
              per-request, s >= 2: advance(rid, token of step s-2)  (the same move, plus the commit)
  free        free(rid)
so after decode every request has 1200 slots = 75 pages, like vLLM's allocate_slots(req, 1).
Hashing (tuple hash of 16 ids, chained) happens inside the manager: in create() for the prompt's
whole pages bar the last token, and in commit() for the rest; it is inside the admission figure.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import load_model_spec

MODE = "batch" if "--batch" in sys.argv else "req"
EVENTS = os.environ.get("KV_BENCH_EVENTS") == "1"
L, S = W1_PROMPT, W1_STEPS


def spec(sliding):
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "hidden_size": 1024,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "bfloat16",
    }
    if sliding:
        config |= {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": W3_WINDOW}
    return load_model_spec(config, tokens_per_block=BS)


SPEC_FULL, SPEC_SWA = spec(False), spec(True)
LIMITS = ServingLimits(max_batch_size=W1_REQS, max_seq_len=8192)


def make(pages, reuse, sliding=False):
    s = SPEC_SWA if sliding else SPEC_FULL
    return KVCacheManager(PoolPlan.from_pages(s, pages, LIMITS), enable_reuse=reuse, events=EVENTS)


def used(m):
    return {g.name: m.total_pages(g.name) - m.free_pages(g.name) for g in m.groups}


def w1(caching, sliding=False):
    """W1 (full attention) or W3 (full + sliding(512)), caching off or on."""

    def run():
        if sliding:
            pages = {"full": w1_blocks_needed() + 64, "sliding": W3_SLIDING_POOL}
        else:
            pages = {"full": w1_blocks_needed() + 64}
        m = make(pages, caching, sliding)
        prompts = [w1_prompt(i) for i in range(W1_REQS)]
        rids = list(range(W1_REQS))
        t1 = begin()
        if MODE == "req":
            for rid in rids:
                hit = m.create(rid, prompts[rid])
                assert m.resize(rid, L, hit)
                if caching:
                    assert m.resize(rid, L, L)
                    m.commit(rid, L)
        else:
            hits = [m.create(rid, prompts[rid]) for rid in rids]
            assert m.resize_many(rids, L, hits)
            if caching:
                assert m.resize_many(rids, L, L)
                for rid in rids:
                    m.commit(rid, L)
        t2 = stamp()
        u_admit = used(m)
        t3 = begin()
        if MODE == "req":
            resize, advance = m.resize, getattr(m, "advance", None)
            for rid in rids:
                if not resize(rid, L + 1, L):
                    raise AssertionError("pool exhausted")
            for step in range(2, S + 1):
                if advance is None:  # a KV_BASE_SRC from before advance: the same step in two calls
                    cap, hist = L + step, L + step - 1
                    for rid in rids:
                        if not resize(rid, cap, hist):
                            raise AssertionError("pool exhausted")
                        if caching:
                            m.commit(rid, hist, (w1_decode_token(rid, step - 2),))
                    continue
                if caching:
                    for rid in rids:
                        if not advance(rid, w1_decode_token(rid, step - 2)):
                            raise AssertionError("pool exhausted")
                else:
                    for rid in rids:
                        if not advance(rid):
                            raise AssertionError("pool exhausted")
        else:
            assert m.resize_many(rids, L + 1, L)
            for _ in range(2, S + 1):
                if not m.extend(rids, 1):
                    raise AssertionError("pool exhausted")
        t4 = stamp()
        u_decode = used(m)
        gen = [[w1_decode_token(rid, s) for s in range(S)] for rid in rids]
        t5 = begin()
        if MODE == "batch" and caching:  # kvpool Scheduler: commit computed pages, then free
            for rid in rids:
                m.resize(rid, L + S, L + S)
                m.commit(rid, L + S, gen[rid])
                m.free(rid)
        else:
            for rid in rids:
                m.free(rid)
        t6 = stamp()
        u_free = used(m)
        m.check_integrity()
        full_a, full_d = u_admit["full"], u_decode["full"]
        expect(full_a == W1_BLOCKS_AFTER_ADMIT, f"full after admit {full_a}")
        expect(full_d == W1_BLOCKS_AFTER_DECODE, f"full after decode {full_d}")
        if sliding:
            # with caching on, admission already advances history to L (needed for commit), which
            # drops the sliding pages before L + 1 - W; the peers drop them at decode step 1
            want = W1_REQS * sliding_live_blocks(L, L) if caching else W3_SLIDING_AFTER_ADMIT
            expect(u_admit["sliding"] == want, f"sliding after admit {u_admit}")
            expect(u_decode["sliding"] == W3_SLIDING_AFTER_DECODE, f"sliding after decode {u_decode}")
        expect(all(v == 0 for v in u_free.values()), f"leak after free {u_free}")
        r = {}
        put(r, "admit_us_per_req", t1, t2, W1_REQS)
        put(r, "decode_us_per_step", t3, t4, S)
        put(r, "free_us_per_req", t5, t6, W1_REQS)
        r.update(
            blocks_after_admit=sum(u_admit.values()),
            blocks_after_decode=sum(u_decode.values()),
            blocks_leaked=sum(u_free.values()),
        )
        return r

    return run


def w2():
    """Shared 4096-token prefix; admissions one by one (each must see its predecessors'
    committed pages, so there is no batched variant: both modes run this same code)."""

    def run():
        m = make({"full": w2_blocks_needed() + 64}, True)
        prompts = [w2_prompt(i) for i in range(W2_REQS)]
        n = W2_SHARED + W2_UNIQUE
        hits = 0
        t1 = begin()
        for rid, p in enumerate(prompts):
            hit = m.create(rid, p)
            assert m.resize(rid, n, hit)
            assert m.resize(rid, n, n)
            m.commit(rid, n)
            hits += hit
        t2 = stamp()
        u_admit = used(m)["full"]
        t3 = begin()
        for rid in range(W2_REQS):
            m.free(rid)
        t4 = stamp()
        u_free = used(m)["full"]
        st = m.stats()
        m.check_integrity()
        total = sum(len(p) for p in prompts)
        expect(hits / total == W2_HIT_RATE, f"hit rate {hits / total}")
        expect(st.reuse_hit_tokens == hits, f"stats hit tokens {st.reuse_hit_tokens} != {hits}")
        expect(u_admit == W2_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        expect(u_free == 0, f"leak {u_free}")
        r = {"hit_rate": hits / total}
        put(r, "admit_incl_hash_us_per_req", t1, t2, W2_REQS)
        put(r, "free_us_per_req", t3, t4, W2_REQS)
        r.update(blocks_after_admit=u_admit, blocks_leaked=u_free)
        return r

    return run


CONFIGS = {
    "W1 off": w1(False),
    "W1 on": w1(True),
    "W2": w2(),
    "W3 off": w1(False, sliding=True),
    "W3 on": w1(True, sliding=True),
}

if os.environ.get("KV_BENCH_ONLY"):
    CONFIGS = {k: CONFIGS[k] for k in os.environ["KV_BENCH_ONLY"].split(",")}

if __name__ == "__main__":
    import kvpool

    sha = os.popen(f"git -C {os.path.dirname(kvpool.__file__)} rev-parse --short HEAD").read().strip()
    main(f"kvpool@{sha} KVCacheManager ({MODE}{', events' if EVENTS else ''})", CONFIGS)
