"""Drive nano-vllm BlockManager (GeeeekExplorer/nano-vllm @bb823b3) with W1/W2.
Needs PYTHONPATH=<nanovllm_min> (minimal package: engine/block_manager.py, engine/sequence.py,
sampling_params.py, empty __init__ files) and pip packages xxhash + numpy.
Hashing: inside can_allocate/allocate (the cached prefix is hashed twice) and hash_blocks.
No sliding-window support, so no W3."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.sequence import Sequence

Sequence.block_size = BS  # class attribute, default 256 (pitfall)


def admit(bm, seq, caching):
    n_cached = bm.can_allocate(seq)
    assert n_cached != -1, "pool exhausted"
    bm.allocate(seq, n_cached)
    hit = seq.num_cached_tokens
    seq.num_scheduled_tokens = seq.num_tokens - seq.num_cached_tokens
    # Scheduler.postprocess after the prefill step:
    if caching:
        bm.hash_blocks(seq)
    seq.num_cached_tokens += seq.num_scheduled_tokens
    seq.num_scheduled_tokens = 0
    return hit


def w1(caching):
    def run():
        nb = w1_blocks_needed() + 64
        bm = BlockManager(nb, BS)
        prompts = [w1_prompt(i) for i in range(W1_REQS)]
        t0 = begin()
        seqs = [Sequence(p) for p in prompts]
        t1 = stamp()
        for s in seqs:
            admit(bm, s, caching)
        t2 = stamp()
        u_admit = len(bm.used_block_ids)
        for i, s in enumerate(seqs):
            s.append_token(w1_decode_token(i, 0))
        t3 = begin()
        for step in range(1, W1_STEPS + 1):
            for i, s in enumerate(seqs):
                # Scheduler.schedule (decode branch)
                assert bm.can_append(s)
                s.num_scheduled_tokens = 1
                bm.may_append(s)
                # Scheduler.postprocess
                if caching:
                    bm.hash_blocks(s)
                s.num_cached_tokens += 1
                s.num_scheduled_tokens = 0
                s.append_token(w1_decode_token(i, step))
        t4 = stamp()
        u_decode = len(bm.used_block_ids)
        t4b = begin()
        for s in seqs:
            bm.deallocate(s)
        t5 = stamp()
        u_free = nb - len(bm.free_block_ids)
        expect(u_admit == W1_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        expect(u_decode == W1_BLOCKS_AFTER_DECODE, f"blocks after decode {u_decode}")
        expect(u_free == 0 and not bm.used_block_ids, f"leak {u_free}")
        r = {}
        put(r, "req_construct_us_per_req", t0, t1, W1_REQS)
        put(r, "admit_us_per_req", t1, t2, W1_REQS)
        put(r, "admit_incl_construct_us_per_req", t0, t2, W1_REQS)
        put(r, "decode_us_per_step", t3, t4, W1_STEPS)
        put(r, "free_us_per_req", t4b, t5, W1_REQS)
        r.update(blocks_after_admit=u_admit, blocks_after_decode=u_decode, blocks_leaked=u_free)
        return r

    return run


def w2():
    def run():
        nb = w2_blocks_needed() + 64
        bm = BlockManager(nb, BS)
        prompts = [w2_prompt(i) for i in range(W2_REQS)]
        t0 = begin()
        seqs = [Sequence(p) for p in prompts]
        t1 = stamp()
        hits = 0
        for s in seqs:
            hits += admit(bm, s, True)
        t2 = stamp()
        u_admit = len(bm.used_block_ids)
        t2b = begin()
        for s in seqs:
            bm.deallocate(s)
        t3 = stamp()
        u_free = nb - len(bm.free_block_ids)
        total = sum(len(p) for p in prompts)
        expect(hits / total == W2_HIT_RATE, f"hit rate {hits / total}")
        expect(u_admit == W2_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        expect(u_free == 0, f"leak {u_free}")
        r = {"hit_rate": hits / total}
        put(r, "req_construct_us_per_req", t0, t1, W2_REQS)
        put(r, "admit_us_per_req", t1, t2, W2_REQS)  # hashing happens in here
        put(r, "admit_incl_hash_us_per_req", t0, t2, W2_REQS)  # + Sequence construction
        put(r, "free_us_per_req", t2b, t3, W2_REQS)
        r.update(blocks_after_admit=u_admit, blocks_leaked=u_free)
        return r

    return run


CONFIGS = {"W1 off": w1(False), "W1 on": w1(True), "W2": w2()}

if __name__ == "__main__":
    main("nano-vllm BlockManager @bb823b3", CONFIGS)
