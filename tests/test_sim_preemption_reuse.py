"""A trace without hash ids still runs with prefix reuse (each prompt its own
ids, `sim/requests.py`): a request preempted by recompute finds its own cached
pages again, as in vLLM V1 and SGLang, so preemptions cost at most the pages
lost, not the whole prompt again. Without it, more KV made the simulated A100
Qwen3-32B 32K point slower (docs/sim.md).

The bound the tests hold a run to. A request preempted with c positions
computed is readmitted with its prompt plus outputs, L ids; its lookup hits
its leading whole pages still cached, never the last id (it must be computed
for logits), so h >= tpb * min(c // tpb, (L - 1) // tpb) when none of them
was evicted, and it recomputes c - h positions mid-prefill (L > c), c + 1 - h
in decode (L = c + 1, the last computed position's token was sampled): under
tpb either way. A page evicted in between costs at most its tpb positions.
So prefill tokens <= prompt load + tpb * (preemptions + pages evicted), and
with reuse off every readmission starts from 0."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sim import SimResult, StepTimeModel, TraceRequest, Weights, simulate
from kvpool.trace import Trace
from sim_helpers import toy_gpu, toy_spec

TPB = 4
SPEC = toy_spec(tpb=TPB)
MODEL = StepTimeModel.build(SPEC, toy_gpu(), Weights(1e9, 1e9, 2.0), "roofline")
LIMITS = ServingLimits(max_batch_size=4, max_seq_len=128, max_num_tokens=16)


def plan(pages: int) -> PoolPlan:
    return PoolPlan.from_pages(SPEC, {g.name: pages for g in SPEC.groups}, LIMITS)


def trace(prompts: list[int], outputs: list[int]) -> Trace:
    n = len(prompts)
    return Trace("t", np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64), np.zeros(n))


def run(pages: int, t: Trace, **kw: object) -> tuple[SimResult, int]:
    """The run and the cached pages it evicted (the manager's removed events)."""
    evicted = [0]

    def count(m: KVCacheManager) -> None:
        evicted[0] += sum(e.kind == "removed" for e in m.take_events())

    r = simulate(plan(pages), t, MODEL, check=True, on_step=count, **kw)  # type: ignore[arg-type]
    assert r.finished == len(t) and r.rejected == 0
    return r, evicted[0]


def bound(t: Trace, r: SimResult, evicted: int) -> int:
    return int(t.prompt_len.sum()) + TPB * (r.preemptions + evicted)


# 17 pages of 4 tokens hold any one request (prompt + output <= 64) and the padding dummy: none is rejected
requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 24)), min_size=2, max_size=7)


@settings(max_examples=60, deadline=None)
@given(reqs=requests, pages=st.integers(17, 48))
def test_preemptions_cost_at_most_the_pages_they_lose(reqs: list[tuple[int, int]], pages: int) -> None:
    t = trace([p for p, _ in reqs], [o for _, o in reqs])
    r, evicted = run(pages, t)
    assert int(t.prompt_len.sum()) <= r.prefill_tokens <= bound(t, r, evicted)
    assert r.prompt_hit_rate == 0.0  # no request's first admission hits another's pages


# The bug's shape: a decoding request's next page preempts a long prompt being
# chunk-prefilled, again and again. With reuse off (as every trace without hash
# ids ran before) 17 pages compute 328 prefill tokens, 23 pages 517, for a
# load of 120: more pages, more work; with reuse each page count stays within
# the bound (at most 162).
SHAPE = trace([40, 40, 40], [24, 24, 24])
PAGES = range(17, 49)


def test_more_pages_never_multiply_the_prefill_work() -> None:
    for pages in PAGES:
        r, evicted = run(pages, SHAPE)
        assert r.prefill_tokens <= bound(SHAPE, r, evicted)
    off = [run(pages, SHAPE, reuse=False)[0] for pages in PAGES]
    assert any(r.prefill_tokens > bound(SHAPE, r, 0) for r in off)  # the test catches the bug
    assert max(r.prefill_tokens for r in off) > off[0].prefill_tokens


def test_no_reuse_recomputes_a_preempted_request_from_its_first_token() -> None:
    r, evicted = run(20, SHAPE, reuse=False)
    assert r.preemptions > 0 and evicted == 0 and r.reuse_hit_rate == 0.0
    assert r.prefill_tokens > bound(SHAPE, r, evicted)


def test_unique_prompts_share_no_page() -> None:
    ids = [TraceRequest(rid, 9, 1).prompt_ids() for rid in range(3)]
    assert all(len(set(a)) == 1 for a in ids) and len({a[0] for a in ids}) == 3
    m = KVCacheManager(plan(64), enable_reuse=True)
    for rid, prompt in enumerate(ids):
        assert m.create(rid, prompt) == 0  # nothing cached matches
        assert m.resize(rid, len(prompt), len(prompt))
        m.commit(rid, len(prompt))
        m.free(rid)
    again = m.create(10, ids[1])  # the same request, readmitted: its own pages (never the last token)
    assert again == 8
    hashed = TraceRequest(7, 8, 1, hash_ids=(2**40, 0), hash_block_tokens=4).prompt_ids()
    assert max(hashed) < min(a[0] for a in ids)  # block ids stay below every unique prompt's
