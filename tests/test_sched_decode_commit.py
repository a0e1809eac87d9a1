"""Decode pages are offered for reuse the step they fill (vLLM caches a block
the step it completes): the stored event comes in that step's batch, a request
arriving mid-generation reuses the tokens generated so far, pages that leave a
sliding window are stored as they leave, and a simulator's run of decode steps
leaves the cache exactly as the same steps one by one, a verbatim repeat of a
finished request's included."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sched import Scheduler, SchedulerError, Sequence, advance_decodes, decode_run_limit
from kvpool.spec import ModelSpec
from sched_helpers import TPB, full_spec, hybrid_spec, run_step

GEN = 7  # the token every decode samples in these tests


def make(pages: dict[str, int], spec: ModelSpec | None = None) -> tuple[KVCacheManager, Scheduler]:
    lim = ServingLimits(max_batch_size=8, max_seq_len=256, max_num_tokens=64)
    mgr = KVCacheManager(PoolPlan.from_pages(spec or full_spec(), pages, lim), enable_reuse=True)
    return mgr, Scheduler(mgr, lim, enable_reuse=True)


def stored_blocks(mgr: KVCacheManager, group: str) -> int:
    """Pages of `group` stored in the events since the last call."""
    return sum(e.kind == "stored" and e.group == group for e in mgr.take_events())


def test_a_decode_page_is_stored_the_step_it_fills() -> None:
    mgr, sched = make({"full": 100})
    seq = Sequence(rid=1, prompt_ids=list(range(100, 106)), max_new_tokens=20)
    sched.add(seq)
    pages = 0  # whole pages computed before the step
    while seq.status.name != "FINISHED":
        run_step(sched, sched.schedule(), GEN)  # type: ignore[arg-type]
        if seq.status.name == "RUNNING":  # (a finished request's pages come with its free)
            # each step stores exactly the pages its computed positions completed: none later
            assert stored_blocks(mgr, "full") == seq.num_computed // TPB - pages
            pages = seq.num_computed // TPB
    assert pages == (6 + 19 - 1) // TPB  # the last step finished it: its pages came with the free


def test_a_request_arriving_mid_generation_reuses_the_tokens_generated_so_far() -> None:
    mgr, sched = make({"full": 100})
    first = Sequence(rid=1, prompt_ids=list(range(100, 106)), max_new_tokens=40)
    sched.add(first)
    for _ in range(12):  # the prefill and 11 decode steps: 6 + 11 = 17 positions computed
        run_step(sched, sched.schedule(), GEN)  # type: ignore[arg-type]
    assert first.num_computed == 17 and first.status.name == "RUNNING"
    follow_up = first.all_ids[: first.num_computed] + [1, 2, 3]
    sched.add(Sequence(rid=2, prompt_ids=follow_up, max_new_tokens=2))
    step = sched.schedule()
    assert step is not None and step.prefills
    # the generated tokens' whole pages were already offered: 4 pages = 16 of the 17 computed positions
    assert step.prefills[0][0].num_cached == first.num_computed // TPB * TPB == 16
    mgr.check_integrity()


def test_decode_pages_leaving_a_sliding_window_are_stored_as_they_leave() -> None:
    # window 8 = 2 pages: a 40-token generation moves pages 2..9 out of the window long before it
    # ends; a follow-up that shares only up to position 24 needs sliding pages 4..5 (the window at
    # history 24), which are stored only if the decode committed them before releasing them
    mgr, sched = make({"full": 100, "sliding": 100}, hybrid_spec(window=8))
    first = Sequence(rid=1, prompt_ids=list(range(100, 104)), max_new_tokens=40)
    sched.add(first)
    while sched.has_work():
        run_step(sched, sched.schedule(), GEN)  # type: ignore[arg-type]
    assert first.status.name == "FINISHED"
    sched.add(Sequence(rid=2, prompt_ids=first.all_ids[:24] + [1, 2], max_new_tokens=1))
    step = sched.schedule()
    assert step is not None and step.prefills[0][0].num_cached == 24
    mgr.check_integrity()


def drive(sched: Scheduler, fast: bool) -> int:
    """Step `sched` to the end, a run of decode steps wherever one applies
    (`fast`); returns the runs made."""
    runs = 0
    while sched.has_work():
        step = sched.schedule()
        assert step is not None
        limit = decode_run_limit(sched, step) if fast else 0
        if limit >= 2 and advance_decodes(sched, step, limit, GEN) is not None:
            runs += 1
            continue
        run_step(sched, step, GEN)
    return runs


def cached(mgr: KVCacheManager) -> list[set[int]]:
    return [set(pool.cached) for pool in mgr.pools]


@pytest.mark.parametrize("window", [None, 8, 12])
@pytest.mark.parametrize("seed", [5, 6, 7])
def test_a_run_of_decode_steps_leaves_the_cache_as_single_steps_do(window: int | None, seed: int) -> None:
    # small pools: the run's released pages are evicted again, so their LRU order shows
    spec = hybrid_spec(window) if window else full_spec()
    pages = {"full": 60, "sliding": 30} if window else {"full": 60}
    rng = np.random.default_rng(seed)
    prompts = [list(map(int, rng.integers(0, 50, int(rng.integers(3, 20))))) for _ in range(6)]
    outs = [int(x) for x in rng.integers(5, 40, 6)]
    results = []
    for fast in (False, True):
        mgr, sched = make(pages, spec)
        for rid, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
            sched.add(Sequence(rid=rid, prompt_ids=prompt, max_new_tokens=out))
        runs = drive(sched, fast)
        mgr.check_integrity()
        results.append((cached(mgr), mgr.stats().reuse_hit_tokens, runs))
    (slow_cached, slow_hits, _), (fast_cached, fast_hits, runs) = results
    assert runs > 0  # the fast path ran
    assert fast_cached == slow_cached and fast_hits == slow_hits


def test_a_run_of_a_verbatim_repeat_stores_what_single_steps_store() -> None:
    # a finished twin leaves its pages cached; its repeat (same prompt, every output GEN) fills pages
    # of the same digests while a stranger's growth evicts the twin's pages. Single steps find each
    # twin page still cached the step the repeat fills it (so the repeat's copy is not stored); a run
    # that allocated all its pages first would have evicted them and stored the repeat's own
    twin = list(range(100, 106))
    results = []
    for fast in (False, True):
        mgr, sched = make({"full": 24})
        sched.add(Sequence(rid=0, prompt_ids=twin, max_new_tokens=30))
        drive(sched, fast)
        assert mgr.pools[0].num_cached == (6 + 30 - 1) // TPB  # the twin's pages, all evictable
        sched.add(Sequence(rid=1, prompt_ids=twin, max_new_tokens=30))
        sched.add(Sequence(rid=2, prompt_ids=list(range(200, 204)), max_new_tokens=60))
        runs = drive(sched, fast)
        mgr.check_integrity()
        pool = mgr.pools[0]
        results.append((cached(mgr), pool.lru_order(), [pool.page_hash[p] for p in pool.lru_order()], runs))
    (slow_cached, slow_lru, slow_hashes, _), (fast_cached, fast_lru, fast_hashes, runs) = results
    assert runs > 0  # the fast path ran
    assert (fast_cached, fast_lru, fast_hashes) == (slow_cached, slow_lru, slow_hashes)


def test_a_run_sampling_no_token_id_is_refused_before_anything_changes() -> None:
    mgr, sched = make({"full": 100})
    sched.add(Sequence(rid=1, prompt_ids=list(range(100, 106)), max_new_tokens=30))
    run_step(sched, sched.schedule(), GEN)  # type: ignore[arg-type]
    step = sched.schedule()
    assert step is not None
    row = step.decodes[0][0]
    before = (row.num_computed, list(row.output_ids), mgr.capacity(1), mgr.history(1))
    with pytest.raises(SchedulerError, match="request 1: sampled ids"):
        advance_decodes(sched, step, decode_run_limit(sched, step), -1)
    assert (row.num_computed, row.output_ids, mgr.capacity(1), mgr.history(1)) == before
