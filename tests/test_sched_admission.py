"""Admission rules (sched/admission.py) against the real manager: the
guaranteed rule never preempts, the optimistic one does, SGLang's ratio moves
as SGLang's tracker does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import KVCacheManager
from kvpool.engines.registry import admission_of as admission_for
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sched import Scheduler, Sequence, Status
from kvpool.sched.admission import ADMISSIONS, Admission
from kvpool.spec import ModelSpec
from sched_helpers import TPB, chunks, drain, full_spec, hybrid_spec, seq


def make(pages: dict[str, int], rule: str, spec: ModelSpec | None = None, **limits: Any) -> Scheduler:
    spec = spec or full_spec()
    limits.setdefault("max_batch_size", 8)
    limits.setdefault("max_seq_len", 256)
    limits.setdefault("max_num_tokens", 64)
    lim = ServingLimits(**limits)
    mgr = KVCacheManager(PoolPlan.from_pages(spec, pages, lim), enable_reuse=False)
    return Scheduler(mgr, lim, admission=Admission.named(rule, spec.groups))


def test_guaranteed_admits_only_what_can_finish() -> None:
    # 10 pages of 4 tokens. Request 1 reserves prompt 12 + 12 outputs = 24 tokens = 6 pages;
    # request 2 needs 8 + 9 = 17 tokens = 5 pages: 6 + 5 > 10, so it waits under the
    # guaranteed rule, while the optimistic rule admits its first chunk at once.
    for rule, admitted in (("guaranteed", [1]), ("optimistic", [1, 2])):
        sched = make({"full": 10}, rule)
        sched.add(seq(1, 12, 12))
        sched.add(seq(2, 8, 9))
        step = sched.schedule()
        assert step is not None and [rid for rid, _, _ in chunks(step)] == admitted, rule


def test_guaranteed_admits_the_next_request_once_the_first_finishes() -> None:
    sched = make({"full": 10}, "guaranteed")
    first, second = seq(1, 12, 12), seq(2, 8, 9)
    sched.add(first)
    sched.add(second)
    done = drain(sched)
    assert [s.rid for s in done] == [1, 2] and sched.num_preemptions == 0
    assert first.status is Status.FINISHED and second.status is Status.FINISHED


def test_a_reservation_larger_than_the_pools_is_rejected_not_stuck() -> None:
    sched = make({"full": 4}, "guaranteed")  # 16 tokens: prompt 8 + 9 outputs never fit
    sched.add(seq(1, 8, 9))
    assert drain(sched) == [] and sched.num_preemptions == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=12),
    st.sampled_from(["full", "hybrid"]),
)
def test_guaranteed_never_preempts(requests: list[tuple[int, int]], kind: str) -> None:
    spec = full_spec() if kind == "full" else hybrid_spec(8)
    pages = {g.name: 20 for g in spec.groups}
    sched = make(pages, "guaranteed", spec, max_num_tokens=16)
    seqs = [seq(i + 1, p, o) for i, (p, o) in enumerate(requests)]
    for s in seqs:
        sched.add(s)
    drain(sched)
    assert sched.num_preemptions == 0
    for s in seqs:
        # a full-attention request that ends past 20 pages can never be admitted
        too_big = kind == "full" and s.prompt_len + s.max_new_tokens > 20 * TPB
        assert s.status is (Status.REJECTED if too_big else Status.FINISHED), (s.rid, s.prompt_len, s.max_new_tokens)


def test_optimistic_preempts_where_guaranteed_does_not() -> None:
    requests = [(12, 20), (12, 20), (12, 20)]  # each ends at 32 tokens = 8 pages; 12 pages hold one
    counts = {}
    for rule in ("optimistic", "guaranteed"):
        sched = make({"full": 12}, rule)
        for i, (p, o) in enumerate(requests):
            sched.add(seq(i + 1, p, o))
        drain(sched)
        counts[rule] = sched.num_preemptions
    assert counts["optimistic"] > 0 and counts["guaranteed"] == 0


def test_sglang_ratio_decays_to_its_floor_and_is_reestimated_after_retraction() -> None:
    # sglang 0.5.23 defaults: init 0.7, floor 0.7 x 0.14, 600 decay steps, 20 retract steps
    rule = Admission.named("sglang", ())
    for _ in range(10):
        rule.step()
    assert rule.ratio == pytest.approx(0.7 - 10 * (0.7 - 0.098) / 600)
    for _ in range(1000):
        rule.step()
    assert rule.ratio == pytest.approx(0.098)
    a, b = Sequence(rid=1, prompt_ids=[1], max_new_tokens=100), Sequence(rid=2, prompt_ids=[1], max_new_tokens=50)
    a.output_ids = [5] * 5
    rule.preempted([a, b])
    assert rule.ratio == pytest.approx((5 + 0 + 20 * 2) / (150 + 1))


def test_sglang_reserves_a_share_of_running_requests_outputs() -> None:
    # 15 pages. Request 1 (prompt 8, 40 outputs) has prefilled and sampled one token: 9 tokens,
    # 2 pages held, 13 free, 39 outputs left. Request 2 (prompt 8, 8 outputs) reserves 16 tokens
    # = 4 pages. SGLang (ratio just under 0.7): request 1 reserves 9 + ceil(0.7 x 39) = 37 tokens
    # = 10 pages, 8 more than it holds: 8 + 4 <= 13 admits. Guaranteed: 9 + 39 = 48 tokens =
    # 12 pages, 10 more: 10 + 4 > 13 waits.
    for pages, rule, admitted in ((15, "sglang", True), (15, "guaranteed", False)):
        sched = make({"full": pages}, rule)
        sched.add(seq(1, 8, 40))
        step = sched.schedule()
        assert step is not None
        sched.update(step, {1: [7]})
        sched.add(seq(2, 8, 8))
        step = sched.schedule()
        assert step is not None
        assert any(rid == 2 for rid, _, _ in chunks(step)) is admitted, rule


def test_engine_policies_map_to_their_rules() -> None:
    assert admission_for("engine:trtllm") == "guaranteed"
    assert admission_for("engine:sglang") == "sglang"
    assert admission_for("engine:vllm") == admission_for("balanced") == "optimistic"
    with pytest.raises(ValueError, match="unknown admission rule"):
        Admission.named("fifo", ())
    assert set(ADMISSIONS) == {"optimistic", "guaranteed", "sglang"}
