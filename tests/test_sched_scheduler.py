"""The shared scheduler against the real KVCacheManager: admission, chunked
prefill, preemption by recompute, padding, drafts, reuse and conservation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import KVCacheManager
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sched import Scheduler, SchedulerError, Sequence, Status, Step
from kvpool.sched.padding import GraphPadding
from kvpool.sched.runs import decode_run_limit
from kvpool.spec import ModelSpec
from sched_helpers import chunks, drain, full_spec, hybrid_spec, run_step, seq


def make(
    pages: dict[str, int],
    spec: ModelSpec | None = None,
    *,
    reuse: bool = False,
    padding: bool = True,
    captured: Any = None,
    pads: Any = None,
    **limits: Any,
) -> tuple[KVCacheManager, Scheduler]:
    limits.setdefault("max_batch_size", 8)
    limits.setdefault("max_seq_len", 256)
    limits.setdefault("max_num_tokens", 64)
    lim = ServingLimits(**limits)
    mgr = KVCacheManager(PoolPlan.from_pages(spec or full_spec(), pages, lim), enable_reuse=reuse)
    return mgr, Scheduler(mgr, lim, padding=padding, captured=captured, padding_rids=pads, enable_reuse=reuse)


def rows(step: Step) -> list[int]:
    return [s.rid for s, _ in step.decodes]


# ----------------------------------------------------------------------------- admission


def test_chunked_prefill_fcfs_under_token_budget() -> None:
    mgr, sched = make({"full": 100}, max_num_tokens=8)
    sched.add(seq(1, 10, 3))
    sched.add(seq(2, 5, 3))
    s1 = sched.schedule()
    assert s1 is not None and chunks(s1) == [(1, 0, 8)] and not s1.decodes
    assert mgr.capacity(1) == 8  # history 0 + 8 tokens (E = 0)
    run_step(sched, s1)
    s2 = sched.schedule()
    # request 1 finishes its prompt (2 tokens), request 2 gets the other 6 of the budget (needs 5)
    assert s2 is not None and chunks(s2) == [(1, 8, 2), (2, 0, 5)]
    run_step(sched, s2)
    s3 = sched.schedule()
    assert s3 is not None and rows(s3) == [1, 2] and not s3.prefills
    # decode: capacity = history + 1 -> 10 + 1 and 5 + 1
    assert (mgr.capacity(1), mgr.capacity(2)) == (11, 6)


def test_decodes_take_the_budget_before_prefill_chunks() -> None:
    _, sched = make({"full": 100}, max_num_tokens=4)
    sched.add(seq(1, 3, 5))
    sched.add(seq(2, 3, 5))
    step = sched.schedule()
    assert step is not None and chunks(step) == [(1, 0, 3), (2, 0, 1)]
    run_step(sched, step)
    step = sched.schedule()
    # request 1 decodes (1 token), request 2 continues its prompt with the 3 left
    assert step is not None and rows(step) == [1] and chunks(step) == [(2, 1, 2)]


def test_max_batch_size_limits_running_requests() -> None:
    _, sched = make({"full": 100}, max_batch_size=2)
    for rid in range(3):
        sched.add(seq(rid, 2, 2))
    step = sched.schedule()
    assert step is not None and [r for r, _, _ in chunks(step)] == [0, 1]
    assert [s.rid for s in sched.waiting] == [2]


def test_extra_kv_tokens_and_drafts_reserve_capacity() -> None:
    mgr, sched = make({"full": 100}, num_extra_kv_tokens=2, max_draft_len=3)
    sched.add(seq(1, 6, 10))
    step = sched.schedule()
    assert step is not None and mgr.capacity(1) == 6 + 2  # prompt + E
    run_step(sched, step)
    step = sched.schedule(draft_lens={1: 3})
    assert step is not None and step.decodes[0][1] == 3
    assert mgr.capacity(1) == 6 + 1 + 3 + 2  # history + input + drafts + E
    assert step.num_tokens == 4
    # two of three drafts accepted plus the bonus token: 3 tokens, history 6 -> 9
    sched.update(step, {1: [5, 5, 5]})
    s = step.decodes[0][0]
    assert s.num_computed == 9 and len(s.output_ids) == 4
    step = sched.schedule()
    assert step is not None and mgr.capacity(1) == 9 + 1 + 2 and mgr.history(1) == 9


def test_drafts_shrink_to_the_token_budget_instead_of_dropping_the_row() -> None:
    # budget 2 tokens per step, 3 drafts asked: the row decodes with 1 draft
    # (1 + 1 = 2 tokens); it used to be skipped, leaving an empty step forever
    mgr, sched = make({"full": 100}, max_draft_len=3, max_num_tokens=2)
    sched.add(seq(1, 2, 10))
    run_step(sched, sched.schedule())  # type: ignore[arg-type]
    step = sched.schedule(draft_lens={1: 3})
    assert step is not None and not step.is_empty
    assert [(s.rid, k) for s, k in step.decodes] == [(1, 1)] and step.num_tokens == 2


def test_decode_must_accept_between_one_and_k_plus_one_tokens() -> None:
    _, sched = make({"full": 100}, max_draft_len=2)
    sched.add(seq(1, 4, 10))
    run_step(sched, sched.schedule())  # type: ignore[arg-type]
    step = sched.schedule(draft_lens={1: 2})
    assert step is not None
    with pytest.raises(SchedulerError, match="must accept 1..3 tokens, got 4"):
        sched.update(step, {1: [1, 2, 3, 4]})


@pytest.mark.parametrize("bad", [-1, 1 << 63, 2.0, True, "7"])
def test_a_sampled_id_that_is_no_token_id_is_refused_before_its_row_changes(bad: object) -> None:
    # sampled ids are checked where they come in (`update`): a decode row keeps its history and output
    mgr, sched = make({"full": 100})
    sched.add(seq(1, 4, 10))
    run_step(sched, sched.schedule())  # type: ignore[arg-type]
    step = sched.schedule()
    assert step is not None and step.decodes
    row = step.decodes[0][0]
    before = (row.num_computed, list(row.output_ids))
    with pytest.raises(SchedulerError, match="request 1: sampled ids"):
        sched.update(step, {1: [bad]})  # type: ignore[list-item]
    assert (row.num_computed, row.output_ids) == before
    mgr.check_integrity()


def test_a_prefill_sampling_no_token_id_is_refused() -> None:
    _, sched = make({"full": 100})
    sched.add(seq(1, 4, 10))
    step = sched.schedule()
    assert step is not None
    with pytest.raises(SchedulerError, match="request 1: sampled ids"):
        sched.update(step, {1: [-3]})
    assert step.prefills[0][0].output_ids == []


def trace_of_steps(sched: Scheduler, mgr: KVCacheManager, asked: list[bool] | None = None) -> list[tuple[Any, ...]]:
    """Drive `sched` to its end, one step at a time; each step as plain values
    with the decode steps it could run at once (and, where `asked` is given,
    whether each blocked head was asked of the manager)."""
    out: list[tuple[Any, ...]] = []
    for _ in range(2_000):
        step = sched.schedule()
        if step is None:
            return out
        if asked is not None and sched.blocked is not None:
            asked.append(sched.blocked.check is not None)
        run = decode_run_limit(sched, step)  # the steps a blocked head waits through (`Blocked.spare`)
        out.append((chunks(step), rows(step), [s.rid for s in step.preempted], [s.rid for s in step.rejected], run))
        run_step(sched, step)
    raise AssertionError("scheduler did not drain")


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30)), min_size=2, max_size=9),
    pages=st.integers(6, 30),
    hybrid=st.booleans(),
    reuse=st.booleans(),
)
def test_a_head_no_pool_has_a_page_for_is_not_asked_and_nothing_changes(
    lengths: list[tuple[int, int]], pages: int, hybrid: bool, reuse: bool
) -> None:
    """`no_room` only skips the manager where `can_create` answers short: the
    steps, and the decode steps a blocked head waits through, are those of a
    scheduler that asks the manager every time (prompts share a prefix, so
    hits count)."""
    spec = hybrid_spec() if hybrid else full_spec()
    runs = []
    for skip in (True, False):
        mgr, sched = make({g.name: pages for g in spec.groups}, spec, reuse=reuse, max_num_tokens=24, max_seq_len=96)
        if not skip:
            sched.no_room = lambda: False  # type: ignore[method-assign]
        for r, (p, o) in enumerate(lengths):
            sched.add(Sequence(rid=r, prompt_ids=[5] * 8 + [r] * p, max_new_tokens=o))
        asked: list[bool] = []
        runs.append(trace_of_steps(sched, mgr, asked))
        if not skip:
            assert all(asked)
    assert runs[0] == runs[1]


def test_no_room_is_a_pool_without_a_free_or_cached_page() -> None:
    mgr, sched = make({"full": 4}, max_num_tokens=64)
    sched.add(seq(0, 16, 4))  # 16 tokens: the 4 pages
    sched.add(seq(1, 4, 4))
    step = sched.schedule()
    assert step is not None and chunks(step) == [(0, 0, 16)]
    assert sched.no_room() and not mgr.can_create(list(range(4)), None, 1)
    assert sched.blocked is not None and sched.blocked.check is None and sched.blocked.spare == {}


# ----------------------------------------------------------------------------- bad requests


def test_add_rejects_bad_requests() -> None:
    _, sched = make({"full": 100}, max_seq_len=16)
    with pytest.raises(SchedulerError, match="empty prompt"):
        sched.add(Sequence(rid=1, prompt_ids=[], max_new_tokens=1))
    with pytest.raises(SchedulerError, match="max_seq_len 16"):
        sched.add(seq(2, 16, 1))
    with pytest.raises(SchedulerError, match="max_new_tokens"):
        sched.add(seq(3, 4, 0))
    sched.add(seq(4, 4, 1))
    with pytest.raises(SchedulerError, match="already queued"):
        sched.add(seq(4, 4, 1))
    # token ids are checked when the request is queued, with reuse on or off, and nothing is queued
    for rid, bad in enumerate(([1, -2, 3], [1, 2**63], [1, "2"], [0.5, 1]), start=5):
        with pytest.raises(SchedulerError, match=f"request {rid}: prompt ids"):
            sched.add(Sequence(rid=rid, prompt_ids=bad, max_new_tokens=1))  # type: ignore[arg-type]
    assert [s.rid for s in sched.waiting] == [4]


def test_request_larger_than_the_pool_is_rejected_not_looped() -> None:
    # 3 pages of 4 tokens hold 12 positions; a 20-token prompt never fits, even chunked
    mgr, sched = make({"full": 3})
    big = seq(1, 20, 2)
    sched.add(big)
    sched.add(seq(2, 4, 2))
    rejected, done = [], []
    while (step := sched.schedule()) is not None:
        rejected += step.rejected
        done += run_step(sched, step)
    assert rejected == [big] and big.status is Status.REJECTED
    assert [s.rid for s in done] == [2]
    assert mgr.free_pages("full") == 3 and mgr.num_requests == 0


def test_max_seq_len_stops_generation() -> None:
    _, sched = make({"full": 100}, max_seq_len=10)
    sched.add(seq(1, 7, 50))
    (done,) = drain(sched)
    # 7 prompt tokens + 3 generated = 10 = max_seq_len
    assert len(done.output_ids) == 3 and done.finish_reason == "max_seq_len"


# ----------------------------------------------------------------------------- preemption


def test_preemption_recomputes_the_most_recent_request() -> None:
    # 6 pages x 4 tokens = 24 positions. Two requests of 8-token prompts take 2 pages
    # each; decoding, each needs a 3rd page at position 8, and a 4th at position 12.
    mgr, sched = make({"full": 6})
    sched.add(seq(1, 8, 10))
    sched.add(seq(2, 8, 10))
    step = sched.schedule()
    assert step is not None and chunks(step) == [(1, 0, 8), (2, 0, 8)]
    run_step(sched, step)
    step = sched.schedule()  # both decode at history 8: pages 3 + 3 = 6, fits
    assert step is not None and rows(step) == [1, 2] and mgr.free_pages("full") == 0
    for _ in range(3):  # positions 9..11 stay within page 3
        run_step(sched, step)
        step = sched.schedule()
        assert step is not None and rows(step) == [1, 2]
    run_step(sched, step)
    # history 12: each needs a 4th page; none free -> request 2 (admitted last) is preempted
    step = sched.schedule()
    assert step is not None
    assert [s.rid for s in step.preempted] == [2] and rows(step) == [1]
    victim = step.preempted[0]
    assert victim.status is Status.WAITING and victim.num_computed == 0
    assert len(victim.output_ids) == 5 and sched.waiting[0] is victim
    assert sched.num_preemptions == 1 and victim.num_preemptions == 1
    assert mgr.free_pages("full") == 6 - 4  # request 1 holds 4 pages, request 2 none
    run_step(sched, step)
    # next step: request 2 comes back and prefills prompt + its 5 outputs = 13 tokens,
    # but only 2 pages (8 positions) are free: the chunk is packed to what fits
    step = sched.schedule()
    assert step is not None and rows(step) == [1] and chunks(step) == [(2, 0, 8)]


def test_everything_finishes_and_no_page_leaks_under_pressure() -> None:
    mgr, sched = make({"full": 12}, max_num_tokens=8)
    lengths = [(5, 9), (13, 3), (2, 17), (9, 9), (20, 1), (3, 12)]
    for rid, (p, o) in enumerate(lengths):
        sched.add(seq(rid, p, o))
    done = drain(sched)
    assert sorted((s.rid, len(s.output_ids)) for s in done) == [(r, o) for r, (_, o) in enumerate(lengths)]
    assert sched.num_preemptions > 0, "the pool was meant to be tight enough to preempt"
    assert mgr.free_pages("full") == 12 and mgr.num_requests == 0
    mgr.check_integrity()


# ----------------------------------------------------------------------------- padding


def decoding(sched: Scheduler, n: int) -> Step:
    for rid in range(n):
        sched.add(seq(rid, 2, 50))
    step = sched.schedule()
    assert step is not None
    run_step(sched, step)
    step = sched.schedule()
    assert step is not None and len(step.decodes) == n and not step.prefills
    return step


def test_decode_batch_pads_to_the_smallest_captured_size() -> None:
    mgr, sched = make({"full": 100}, captured=[(1, 0), (2, 0), (4, 0), (8, 0)])
    pads = mgr.add_dummy_requests(1, 1).ids
    sched.graphs.padding_rids = {0: pads[0]}
    step = decoding(sched, 3)
    assert (step.batch_size, step.padded_batch_size, step.padding_rid, step.graph) == (3, 4, pads[0], True)


def test_exact_captured_size_needs_no_padding() -> None:
    _, sched = make({"full": 100}, captured=[(1, 0), (2, 0), (4, 0)])
    step = decoding(sched, 4)
    assert (step.padded_batch_size, step.padding_rid, step.graph) == (4, None, True)


def test_no_padding_dummy_or_no_captured_size_runs_eager() -> None:
    _, sched = make({"full": 100}, captured=[(1, 0), (2, 0), (4, 0)])
    step = decoding(sched, 3)  # pads to 4, but no padding dummy was reserved
    assert (step.padded_batch_size, step.graph) == (None, False)
    _, sched = make({"full": 100}, captured=[(1, 0), (2, 0)])
    step = decoding(sched, 3)  # no captured graph holds 3 rows
    assert (step.padded_batch_size, step.graph) == (None, False)


def test_mixed_steps_never_replay_a_graph() -> None:
    _, sched = make({"full": 100}, captured=[(1, 0), (2, 0)])
    sched.add(seq(1, 2, 5))
    run_step(sched, sched.schedule())  # type: ignore[arg-type]
    sched.add(seq(2, 2, 5))
    step = sched.schedule()
    assert step is not None and rows(step) == [1] and chunks(step) == [(2, 0, 2)]
    assert not step.graph and step.padded_batch_size is None


def test_lazy_padding_dummy_comes_from_the_pool_and_fails_when_it_is_full() -> None:
    # 3 decodes of 2-token prompts hold one page each (capacity 3 <= 4)
    mgr, sched = make({"full": 4}, padding=False, captured=[(1, 0), (2, 0), (4, 0)])
    step = decoding(sched, 3)
    assert step.graph and step.padding_rid is not None and step.padding_rid < 0
    assert mgr.free_pages("full") == 0  # the dummy took the last page
    run_step(sched, step)
    assert mgr.free_pages("full") == 1  # freed after the step
    mgr2, sched2 = make({"full": 3}, padding=False, captured=[(1, 0), (2, 0), (4, 0)])
    step = decoding(sched2, 3)
    assert not step.graph and step.padding_rid is None and mgr2.free_pages("full") == 0


def test_lazy_padding_dummy_with_drafts_counts_them_once() -> None:
    # Rule 2: a minimal generation dummy with d = 3 drafts needs capacity 1 + 3 = 4
    # positions = exactly one 4-token page; asking for token_num 1 + d as well
    # would need 1 + 3 + 3 = 7 positions = two pages and fail on a pool with one.
    mgr, _ = make({"full": 1}, max_draft_len=3)
    padding = GraphPadding(mgr, [(2, 3)], reserved=False)
    padded, rid = padding.pad(1, 3)
    assert padded == 2 and rid is not None, "lazy dummy refused"
    assert (mgr.capacity(rid), mgr.history(rid)) == (4, 0)
    padding.release()
    assert mgr.free_pages("full") == 1


def test_warmup_report_feeds_the_scheduler() -> None:
    mgr, _ = make({"full": 100}, max_batch_size=8)
    report = mgr.warmup()
    pads = {d: r for d, r in report.padding.items() if r is not None}
    sched = Scheduler(mgr, mgr.limits, captured=report.captured, padding_rids=pads)
    step = decoding(sched, 5)  # default sizes 1, 2, 4, 8: pads to 8
    assert (step.padded_batch_size, step.graph) == (8, True)


# ----------------------------------------------------------------------------- reuse


def test_shared_prefix_is_reused_after_the_first_request_commits() -> None:
    mgr, sched = make({"full": 100}, reuse=True)
    prompt = list(range(100, 110))  # 10 tokens: two full pages of 4, then 2 tokens
    sched.add(Sequence(rid=1, prompt_ids=prompt, max_new_tokens=2))
    run_step(sched, sched.schedule())  # type: ignore[arg-type]
    sched.add(Sequence(rid=2, prompt_ids=prompt + [5, 6], max_new_tokens=2))
    step = sched.schedule()
    assert step is not None
    # request 2 reuses the two committed full pages (8 tokens) and computes 4 more
    assert chunks(step) == [(2, 8, 4)] and step.prefills[0][0].num_cached == 8
    drain(sched)
    mgr.check_integrity()


@pytest.mark.parametrize("chunk", [64, 8])  # the prompt in one step, or in chunks of 8
def test_shared_system_prompt_is_reused_on_a_sliding_model(chunk: int) -> None:
    # window 8 = 2 pages of 4. A = 16-token system prompt + 16 tokens of its own:
    # while A computes past the system prompt, its pages 2..3 (positions 8..15)
    # leave the window. B shares only the system prompt: a hit of 4 pages needs
    # full pages 0..3 and the sliding pages live at history 16 (stale(16) =
    # floor((16 + 1 - 8)/4) = 2, so pages 2..3) -- exactly the pages A released.
    mgr, sched = make({"full": 100, "sliding": 100}, hybrid_spec(window=8), reuse=True, max_num_tokens=chunk)
    system = list(range(500, 516))
    sched.add(Sequence(rid=1, prompt_ids=system + list(range(16)), max_new_tokens=1))
    drain(sched)
    sched.add(Sequence(rid=2, prompt_ids=system + [7, 7, 7], max_new_tokens=1))
    step = sched.schedule()
    assert step is not None
    assert step.prefills[0][0].num_cached == 16, chunks(step)
    drain(sched)
    mgr.check_integrity()


def test_preempted_request_hits_its_own_pages_when_readmitted() -> None:
    mgr, sched = make({"full": 6}, reuse=True)
    sched.add(seq(1, 8, 10))
    sched.add(seq(2, 8, 10))
    step = sched.schedule()
    for _ in range(5):  # the prefill, then decodes at history 8..11
        assert step is not None
        run_step(sched, step)
        step = sched.schedule()
    assert step is not None and [s.rid for s in step.preempted] == [2]
    # Its 12 computed tokens (8 prompt + 4 generated = 3 pages) were committed
    # before the free. Request 1 then evicts the least recently used of them
    # (the tail first) as it grows; when request 2 comes back, what is left of
    # its prefix is reused and its prefill starts after it.
    while not any(s.rid == 2 for s, _, _ in step.prefills):
        run_step(sched, step)
        step = sched.schedule()
        assert step is not None
    ((again, start, _),) = [p for p in step.prefills if p[0].rid == 2]
    assert start == again.num_cached and start in (4, 8, 12), start
    drain(sched)
    mgr.check_integrity()


# ----------------------------------------------------------------------------- invariants


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=10),
    pages=st.integers(8, 40),
    budget=st.integers(1, 32),
    hybrid=st.booleans(),
    reuse=st.booleans(),
)
def test_conservation(lengths: list[tuple[int, int]], pages: int, budget: int, hybrid: bool, reuse: bool) -> None:
    """Every request either finishes with exactly its tokens or is rejected as
    unfittable; afterwards every page is free and the bookkeeping is intact."""
    spec = hybrid_spec() if hybrid else full_spec()
    groups = {g.name: pages for g in spec.groups}
    mgr, sched = make(groups, spec, reuse=reuse, max_num_tokens=budget, max_seq_len=64)
    seqs = [Sequence(rid=r, prompt_ids=[r % 3] * p, max_new_tokens=o) for r, (p, o) in enumerate(lengths)]
    for s in seqs:
        sched.add(s)
    done = drain(sched)
    for s in seqs:
        if s.status is Status.FINISHED:
            assert len(s.output_ids) == s.max_new_tokens, (s.rid, len(s.output_ids), s.max_new_tokens)
        else:
            assert s.status is Status.REJECTED, (s.rid, s.status)
    assert {s.rid for s in done} == {s.rid for s in seqs if s.status is Status.FINISHED}
    for g in spec.groups:
        assert mgr.free_pages(g.name) == pages, (g.name, mgr.free_pages(g.name))
    mgr.check_integrity()


# ----------------------------------------------------------------------------- preemption by suspension


def test_preemption_is_recompute_or_suspend() -> None:
    mgr, _ = make({"full": 8})
    with pytest.raises(SchedulerError, match="preemption"):
        Scheduler(mgr, mgr.limits, preemption="swap")  # type: ignore[arg-type]


def test_suspension_parks_a_victim_and_resumes_it_where_it_stopped() -> None:
    # two requests of 100 positions (25 pages of 4 each) in 30 pages: once their decodes outgrow the pool
    # the newest is suspended to the host tier (its computed positions kept, not recomputed) and resumes
    # when the other has finished
    from kvpool.cache import TierSpec

    lim = ServingLimits(max_batch_size=8, max_seq_len=256, max_num_tokens=64)
    plan = PoolPlan.from_pages(full_spec(), {"full": 30}, lim)
    mgr = KVCacheManager(plan, enable_reuse=False, tiers=[TierSpec(Medium.CPU, 64 * plan.groups[0].page_bytes)])
    sched = Scheduler(mgr, lim, padding=False, preemption="suspend")
    a, b = seq(1, 40, 60), seq(2, 40, 60)
    sched.add(a)
    sched.add(b)
    done = drain(sched)
    assert [s.rid for s in done] == [1, 2] and all(len(s.output_ids) == 60 for s in done)
    assert sched.num_suspensions >= 1 and sched.num_preemptions == sched.num_suspensions  # no recompute
    assert sched.suspended_pages == sched.resumed_pages > 0
    assert not sched.suspended and mgr.num_requests == 0
    mgr.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    pages=st.integers(6, 40),
    shared=st.booleans(),
    first=st.integers(1, 60),
    second=st.integers(20, 200),
    budget=st.integers(8, 256),
)
def test_a_prefill_chunk_is_the_longest_the_pages_hold(
    pages: int, shared: bool, first: int, second: int, budget: int
) -> None:
    """Every prefill chunk is the longest that fits: one token more does not
    (in a pool shared by a full and a sliding group too, where a page short
    takes more than a page of tokens to make up)."""
    from cache_helpers import twin_spec
    from shared_pool_helpers import shared_manager

    spec = twin_spec(tpb=4, window=8)
    limits = ServingLimits(max_batch_size=4, max_seq_len=512, max_num_tokens=budget)
    if shared:
        manager = shared_manager(spec, 2 * pages, reuse=False, max_batch_size=4, max_seq_len=512, max_num_tokens=budget)
    else:
        manager = KVCacheManager(
            PoolPlan.from_pages(spec, {"full": pages, "sliding": pages}, limits), enable_reuse=False
        )
    sched = Scheduler(manager, limits, enable_reuse=False)
    sched.add(seq(0, first, 50))
    sched.add(seq(1, second, 5))
    for _ in range(20):
        step = sched.schedule()
        if step is None:
            break
        used = sum(1 + k for _, k in step.decodes) + sum(n for _, _, n in step.prefills)
        for s, start, n in step.prefills:
            if start + n < s.num_tokens and used < budget:  # cut short by pages, not by the budget
                assert not manager.can_resize(s.rid, start + n + 1, start)
        run_step(sched, step)


def test_a_head_is_asked_again_and_created_with_the_ids_the_manager_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocked head is asked again, and an admitted one created, with the
    ids the manager's last answer about it handed back (`CreateCheck.ids`),
    which it takes without comparing them with its own copy; the requests run
    as with their own ids."""
    mgr, sched = make({"full": 7}, reuse=True, max_num_tokens=64)
    calls: dict[int, list[tuple[str, object, object]]] = {}  # rid -> (call, ids passed, ids handed back)
    can_create, create = mgr.can_create, mgr.create

    def asking(tokens: Any, salt: Any = None, num_tokens: int = 1, *, frozen: bool = False) -> Any:
        assert list(tokens) == list(sched.waiting[0].token_ids)  # the head's ids as they are now
        assert frozen  # `token_ids` is never written: kept by the manager, not copied
        check = can_create(tokens, salt, num_tokens, frozen=frozen)
        calls.setdefault(sched.waiting[0].rid, []).append(("can_create", tokens, check.ids))
        return check

    def creating(rid: int, tokens: Any = None, salt: Any = None) -> int:
        assert list(tokens) == list(sched.waiting[0].token_ids)
        calls[rid].append(("create", tokens, None))
        return create(rid, tokens, salt)

    monkeypatch.setattr(mgr, "can_create", asking)
    monkeypatch.setattr(mgr, "create", creating)
    first, second = seq(1, 20, 6), seq(2, 9, 2)  # the second waits for the first's pages, or is preempted
    sched.add(first)
    sched.add(second)
    assert sorted(s.rid for s in drain(sched)) == [1, 2]
    assert sum(call == "can_create" for call, _, _ in calls[2]) > sum(call == "create" for call, _, _ in calls[2])
    for s in (first, second):
        last, kept = "create", None  # the call before, the ids the last answer handed back
        for call, passed, handed in calls[s.rid]:
            if last == "can_create":  # asked again, or created: with the ids the answer before handed back
                assert passed is kept is not None
            else:  # asked first with its own ids (once preempted, with those handed back if they still are its ids)
                assert call == "can_create" and (passed is s.token_ids or passed is kept)
            last, kept = call, handed or kept
        assert last == "create"
