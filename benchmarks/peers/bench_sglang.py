"""Drive SGLang 0.5.23 PagedTokenToKVPoolAllocator + ReqToTokenPool + RadixCache on CPU tensors.
Mirrors allocation.alloc_for_extend / alloc_for_decode_default (non-Triton branch) and
RadixCache.checkpoint + common.release_kv_cache, without building Req/ScheduleBatch objects.
Hashing: none (the radix tree walks raw token ids).

W3 (caching off only): SWATokenToKVPoolAllocator over an SWAKVPool (tiny real CPU buffers, one
full and one SWA layer). Per decode step, ScheduleBatch.maybe_evict_swa is mirrored: a Python loop
over the requests with the scheduler's trigger (SGLANG_SWA_EVICTION_INTERVAL, default 128 tokens,
skipped in a request's first decode batch) calling common.free_swa_out_of_window_slots, then one
batched alloc_decode for both pools; free is common.free_kv_row_segments (what free_kv_row does).
W3 caching on would need UnifiedRadixCache (the only tree for full+SWA), which needs Req objects;
not driven."""

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore")
from array import array

import torch
import tvstub  # noqa: F401  (torchvision stub; PyPI torchvision is CUDA-only)
from common import *
from sglang.srt.managers.schedule_batch import ReqKvInfo
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import free_kv_row_segments, free_swa_out_of_window_slots
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType

torch.set_num_threads(1)
SWA_EVICTION_INTERVAL = int(os.environ.get("SGLANG_SWA_EVICTION_INTERVAL", "128"))  # sglang default


def make(num_pages, max_ctx, disable):
    alloc = PagedTokenToKVPoolAllocator(
        size=num_pages * BS, page_size=BS, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False
    )
    r2t = ReqToTokenPool(size=W1_REQS, max_context_len=max_ctx, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(disable=disable, req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=BS)
    tree = RadixCache(params)
    return alloc, r2t, tree


def used_pages(alloc, npages):
    return npages - alloc.available_size() // BS  # pages held by requests or the tree


class R:  # per-request bookkeeping normally held in Req.kv
    __slots__ = ("toks", "slot", "lock", "protected", "seq_len")


def checkpoint(tree, r2t, alloc, r, up_to):
    """RadixCache.checkpoint(req, up_to) equivalent."""
    if tree.disable:
        return
    key = RadixKey(r.toks[:up_to]).page_aligned(BS)
    row = r2t.req_to_token[r.slot, :up_to]
    res = tree.insert(InsertParams(key=key, value=row[: len(key)].to(torch.int64, copy=True), inserted_len=r.protected))
    alloc.free_segment(row[r.protected : res.prefix_len], start_pos=r.protected)
    m = tree.match_prefix(MatchPrefixParams(key=key))
    new_idx = tree.path_device_indices(m.last_device_node)
    r2t.write((r.slot, slice(r.protected, len(new_idx))), new_idx[r.protected :])
    r.protected = len(new_idx)
    tree.unlock(r.lock)
    r.lock = tree.lock(m.last_device_node)


def admit(alloc, r2t, tree, toks):
    r = R()
    r.toks = array("q", toks)
    n = len(toks)
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(r.toks)))
    prefix = tree.path_device_indices(m.last_device_node)
    plen = m.device_prefix_len
    r.lock = tree.lock(m.last_device_node)
    r.slot = r2t.alloc_rows(1)[0]
    pl = torch.tensor([plen], dtype=torch.int64)
    sl = torch.tensor([n], dtype=torch.int64)
    last = prefix[-1:].to(torch.int64) if plen else torch.tensor([-1], dtype=torch.int64)
    out = alloc.alloc_extend(pl, pl, sl, sl, last, n - plen)
    assert out is not None, "pool exhausted"
    if plen:
        r2t.write((r.slot, slice(0, plen)), prefix)
    r2t.write((r.slot, slice(plen, n)), out)
    r.protected = plen
    r.seq_len = n
    checkpoint(tree, r2t, alloc, r, n)  # cache_unfinished_req after the prefill step
    return r, plen


def release(alloc, r2t, tree, r):
    """common.release_kv_cache(req, tree, checkpoint=True) equivalent."""
    checkpoint(tree, r2t, alloc, r, r.seq_len)
    row = r2t.req_to_token[r.slot]
    if r.seq_len > r.protected:
        alloc.free_segment(row[r.protected : r.seq_len], start_pos=r.protected)
    tree.unlock(r.lock)
    r2t.free_rows([r.slot])


def w1(caching):
    def run():
        npages = w1_blocks_needed() + 64
        alloc, r2t, tree = make(npages, W1_PROMPT + W1_STEPS + 16, disable=not caching)
        prompts = [w1_prompt(i) for i in range(W1_REQS)]
        t1 = begin()
        reqs = [admit(alloc, r2t, tree, p)[0] for p in prompts]
        t2 = stamp()
        u_admit = used_pages(alloc, npages)
        rpi = torch.tensor([r.slot for r in reqs], dtype=torch.int64)
        seq_lens = torch.full((W1_REQS,), W1_PROMPT, dtype=torch.int64)
        seq_lens_cpu = seq_lens.clone()
        t3 = begin()
        for _step in range(W1_STEPS):  # alloc_for_decode_default, paged branch
            last_loc = r2t.req_to_token[rpi, seq_lens - 1]
            out = alloc.alloc_decode(seq_lens + 1, seq_lens_cpu + 1, last_loc)
            assert out is not None
            r2t.write((rpi, seq_lens.clone()), out.to(torch.int32))
            seq_lens.add_(1)
            seq_lens_cpu.add_(1)
        t4 = stamp()
        u_decode = used_pages(alloc, npages)
        for r in reqs:
            r.seq_len = W1_PROMPT + W1_STEPS
            r.toks.extend(w1_decode_token(0, s) for s in range(W1_STEPS))
        t4b = begin()
        for r in reqs:
            release(alloc, r2t, tree, r)
        t5 = stamp()
        held = 0 if tree.disable else tree.evictable_size()
        expect(alloc.available_size() + held == npages * BS, (alloc.available_size(), held))
        expect(tree.disable or tree.protected_size() == 0, "tree still locked")
        expect(u_admit == W1_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        expect(u_decode == W1_BLOCKS_AFTER_DECODE, f"blocks after decode {u_decode}")
        r = {}
        put(r, "admit_us_per_req", t1, t2, W1_REQS)
        put(r, "decode_us_per_step", t3, t4, W1_STEPS)
        put(r, "free_us_per_req", t4b, t5, W1_REQS)
        r.update(
            blocks_after_admit=u_admit,
            blocks_after_decode=u_decode,
            blocks_leaked=npages - (alloc.available_size() + held) // BS,
        )
        return r

    return run


def w1_batched_prefill():
    """All 256 prompts in one alloc_extend call (SGLang batches prefills); caching off."""

    def run():
        npages = w1_blocks_needed() + 64
        alloc, r2t, tree = make(npages, W1_PROMPT + W1_STEPS + 16, disable=True)
        t1 = begin()
        slots = r2t.alloc_rows(W1_REQS)
        pl = torch.zeros(W1_REQS, dtype=torch.int64)
        sl = torch.full((W1_REQS,), W1_PROMPT, dtype=torch.int64)
        last = torch.full((W1_REQS,), -1, dtype=torch.int64)
        out = alloc.alloc_extend(pl, pl, sl, sl, last, W1_REQS * W1_PROMPT)
        r2t.req_to_token[torch.tensor(slots), :W1_PROMPT] = out.view(W1_REQS, W1_PROMPT).to(torch.int32)
        t2 = stamp()
        u_admit = used_pages(alloc, npages)
        expect(u_admit == W1_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        r = {}
        put(r, "admit_us_per_req", t1, t2, W1_REQS)
        r.update(blocks_after_admit=u_admit)
        return r

    return run


def w2():
    def run():
        npages = w2_blocks_needed() + 64
        alloc, r2t, tree = make(npages, W2_SHARED + W2_UNIQUE + 16, disable=False)
        prompts = [w2_prompt(i) for i in range(W2_REQS)]
        hits = 0
        reqs = []
        t1 = begin()
        for p in prompts:
            r, h = admit(alloc, r2t, tree, p)
            reqs.append(r)
            hits += h
        t2 = stamp()
        u_admit = used_pages(alloc, npages)
        t2b = begin()
        for r in reqs:
            release(alloc, r2t, tree, r)
        t3 = stamp()
        total = sum(len(p) for p in prompts)
        held = tree.evictable_size()
        expect(alloc.available_size() + held == npages * BS, (alloc.available_size(), held))
        expect(hits / total == W2_HIT_RATE, f"hit rate {hits / total}")
        expect(u_admit == W2_BLOCKS_AFTER_ADMIT, f"blocks after admit {u_admit}")
        r = {"hit_rate": hits / total}
        put(r, "admit_incl_hash_us_per_req", t1, t2, W2_REQS)  # no hashing: radix walk over ids
        put(r, "free_us_per_req", t2b, t3, W2_REQS)
        r.update(blocks_after_admit=u_admit, blocks_leaked=npages - (alloc.available_size() + held) // BS)
        return r

    return run


# ------------------------------------------------------------------------------------------ W3
class SwaReq:  # the parts of Req that free_swa_out_of_window_slots reads
    __slots__ = ("kv", "seqlen")


def w3_off():
    def run():
        full_pages, swa_pages = w1_blocks_needed() + 64, W3_SLIDING_POOL
        kv = SWAKVPool(
            size=full_pages * BS,
            size_swa=swa_pages * BS,
            page_size=BS,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=8,
            swa_attention_layer_ids=[1],
            full_attention_layer_ids=[0],
            device="cpu",
        )
        alloc = SWATokenToKVPoolAllocator(
            full_pages * BS, swa_pages * BS, BS, torch.bfloat16, "cpu", kv, need_sort=False
        )
        r2t = ReqToTokenPool(
            size=W1_REQS, max_context_len=W1_PROMPT + W1_STEPS + 16, device="cpu", enable_memory_saver=False
        )

        def used():
            return (full_pages - alloc.full_available_size() // BS, swa_pages - alloc.swa_available_size() // BS)

        n = W1_PROMPT
        reqs = []
        t1 = begin()
        for _i in range(W1_REQS):  # alloc_for_extend, bs=1, no prefix (nothing to evict at extend)
            r = SwaReq()
            slot = r2t.alloc_rows(1)[0]
            r.kv = ReqKvInfo(req_pool_idx=slot)
            pl = torch.tensor([0], dtype=torch.int64)
            sl = torch.tensor([n], dtype=torch.int64)
            out = alloc.alloc_extend(pl, pl, sl, sl, torch.tensor([-1], dtype=torch.int64), n)
            assert out is not None, "pool exhausted"
            r2t.write((slot, slice(0, n)), out)
            r.kv.kv_allocated_len = n
            r.seqlen = n + 1  # prompt + first sampled token
            reqs.append(r)
        t2 = stamp()
        u_admit = used()
        rpi = torch.tensor([r.kv.req_pool_idx for r in reqs], dtype=torch.int64)
        seq_lens = torch.full((W1_REQS,), n, dtype=torch.int64)
        seq_lens_cpu = seq_lens.clone()
        W, iv = W3_WINDOW, SWA_EVICTION_INTERVAL
        swa = ComponentType.SWA
        t3 = begin()
        for step in range(W1_STEPS):
            # ScheduleBatch.maybe_evict_swa (decode branch); decode_batch_idx >= 1 from the 2nd step
            alloc.free_group_begin()
            if step >= 1:
                for r in reqs:
                    if r.seqlen - 1 - W >= r.kv.get_evicted_seqlen(swa) + iv:
                        free_swa_out_of_window_slots(
                            r,
                            r.seqlen - 1,
                            sliding_window_size=W,
                            page_size=BS,
                            req_to_token_pool=r2t,
                            token_to_kv_pool_allocator=alloc,
                            supports_prefix_sharing=False,
                            retain_floor=None,
                            eviction_interval=1,
                        )
            alloc.free_group_end()
            last_loc = r2t.req_to_token[rpi, seq_lens - 1]
            out = alloc.alloc_decode(seq_lens + 1, seq_lens_cpu + 1, last_loc)
            assert out is not None
            r2t.write((rpi, seq_lens.clone()), out.to(torch.int32))
            seq_lens.add_(1)
            seq_lens_cpu.add_(1)
            for r in reqs:
                r.kv.kv_allocated_len += 1
                r.seqlen += 1
        t4 = stamp()
        u_decode = used()
        evicted = reqs[0].kv.get_evicted_seqlen(swa)
        t4b = begin()
        for r in reqs:  # release_kv_cache with a disabled tree: free_kv_row, then the row
            row = r2t.req_to_token[r.kv.req_pool_idx]
            free_kv_row_segments(
                alloc,
                [(row[0 : r.kv.kv_allocated_len], 0)],
                swa_evicted_seqlen=r.kv.get_evicted_seqlen(swa),
                swa_dead_lo=r.kv.swa_dead_lo(BS),
            )
            r2t.free_rows([r.kv.req_pool_idx])
            r.kv.mark_kv_released()
        t5 = stamp()
        u_free = used()
        # SGLang frees out-of-window SWA pages lazily (every >= 128 tokens), so it holds more:
        # after decode each request has evicted `evicted` positions of its 1200.
        want_swa_decode = W1_REQS * (cdiv(W1_PROMPT + W1_STEPS, BS) - evicted // BS)
        expect(u_admit == (W1_BLOCKS_AFTER_ADMIT, W3_SLIDING_AFTER_ADMIT), f"after admit {u_admit}")
        expect(u_decode == (W1_BLOCKS_AFTER_DECODE, want_swa_decode), f"after decode {u_decode}")
        expect(u_free == (0, 0), f"leak {u_free}")
        r = {}
        put(r, "admit_us_per_req", t1, t2, W1_REQS)
        put(r, "decode_us_per_step", t3, t4, W1_STEPS)
        put(r, "free_us_per_req", t4b, t5, W1_REQS)
        r.update(
            blocks_after_admit=sum(u_admit),
            blocks_after_decode=sum(u_decode),
            blocks_leaked=sum(u_free),
            swa_evicted_positions=evicted,
        )
        return r

    return run


CONFIGS = {
    "W1 off": w1(False),
    "W1 on": w1(True),
    "W1 off batched-prefill": w1_batched_prefill(),
    "W2": w2(),
    "W3 off": w3_off(),
}

if __name__ == "__main__":
    main("sglang 0.5.23 PagedTokenToKVPoolAllocator + RadixCache", CONFIGS)
