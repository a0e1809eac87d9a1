"""The profile phase holds exactly the shapes warmup runs (docs/plan.md,
"Profile phase"): the context dummy with its generated token and drafts, the
general batch of B minimal decodes, and the largest CUDA-graph batch around one
max-length dummy. Each is allocated by the real manager on the profile plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import KVCacheManager, WarmupReport
from kvpool.errors import InfeasiblePlanError
from kvpool.plan import PoolPlan, ServingLimits, estimate_profile_bytes, plan_pools
from kvpool.plan.families import longest_decode_batch
from kvpool.plan.feasibility import base_floors, batch_floors, merge_floors, pages_bytes
from kvpool.spec import ModelSpec, Shape, load_model_spec
from plan_helpers import assert_within_budget, group, model

LLAMA = ServingLimits(max_batch_size=1024, max_seq_len=131072, max_num_tokens=8192)
PAGE_4MIB = 4 * 2**20  # llama-3.1-8b: 32 layers x 2 x 8 heads x 128 dims x 2 B x 32 positions


def warm(plan: PoolPlan, draft_lens: tuple[int, ...] = (0,)) -> WarmupReport:
    return KVCacheManager(plan, enable_reuse=False).warmup(plan.limits.graph_batch_sizes, draft_lens)


def assert_holds_every_warmup_shape(plan: PoolPlan, draft_len: int = 0) -> None:
    report = warm(plan, (draft_len,))
    assert report.unfit == {}, report.unfit
    assert not report.skipped, report.skipped
    longest = {report.lengths[(b, draft_len)] for b in plan.limits.graph_batch_sizes}
    assert longest == {plan.limits.max_seq_len}, longest


def trtllm_estimate_blocks(limits: ServingLimits, tpb: int) -> int:
    """TensorRT-LLM's three-term estimate of the temporary pool (one full group)."""
    d = limits.max_draft_len
    context = math.ceil(((limits.max_num_tokens or 0) + 1 + d) / tpb)
    graph = math.ceil((limits.max_seq_len + 1) / tpb) + limits.largest_graph_batch - 1
    return max(context, graph, limits.max_batch_size)


def test_llama_profile_plan_holds_the_warmup_it_runs() -> None:
    spec = load_model_spec("llama-3.1-8b-instruct")
    assert spec.tokens_per_block == 32 and LLAMA.largest_graph_batch == 256
    # context ceil(8193/32) = 257 pages; 1024 minimal decodes = 1024 pages; the
    # longest graph dummy holds 131072 tokens (history 131071 + the input token,
    # rule 2) = 4096 pages, plus 255 minimal decodes: 4351 pages, the max.
    estimate = estimate_profile_bytes(spec, LLAMA)
    assert estimate == 4351 * PAGE_4MIB
    # TensorRT-LLM counts the current token twice: one block more.
    assert trtllm_estimate_blocks(LLAMA, 32) == 4352
    plan = plan_pools(spec, LLAMA, kv_memory_bytes=estimate, phase="profile")
    assert_within_budget(plan)
    assert plan.pages("full") == 4351
    assert [c.name for c in plan.constraints] == ["warmup_context", "warmup_batch", "graph_longest"]
    assert_holds_every_warmup_shape(plan)


def test_a_budget_one_page_short_names_the_longest_graph_shape() -> None:
    spec = load_model_spec("llama-3.1-8b-instruct")
    with pytest.raises(InfeasiblePlanError) as e:
        plan_pools(spec, LLAMA, kv_memory_bytes=4350 * PAGE_4MIB, phase="profile")
    assert e.value.constraint == "graph_longest" and e.value.short_pages == 1


def test_the_old_profile_floors_starved_warmup() -> None:
    # Before: one context of N + E and 256 minimal decodes, 256 pages (1 GiB).
    # On it the general batch of 1024 decodes is 768 pages short and the
    # longest bs = 1 dummy shrinks to 8192 tokens: what the new floors prevent.
    spec = load_model_spec("llama-3.1-8b-instruct")
    old = plan_pools(spec, LLAMA, kv_memory_bytes=256 * PAGE_4MIB, pool_ratio={"full": 1.0})
    report = warm(old)
    assert report.unfit["warmup_batch"] == {"full": 768}
    assert report.lengths[(1, 0)] == 8192


@pytest.mark.parametrize("name", ["gemma-3-27b", "deepseek-v4-flash"])
def test_hybrid_profile_plans_hold_the_warmup_they_run(name: str) -> None:
    spec = load_model_spec(name)
    limits = ServingLimits(max_batch_size=256, max_seq_len=32768, max_num_tokens=8192, max_draft_len=2)
    plan = plan_pools(spec, limits, kv_memory_bytes=estimate_profile_bytes(spec, limits), phase="profile")
    assert_within_budget(plan)
    assert_holds_every_warmup_shape(plan, draft_len=2)


def test_deepseek_v4_longest_decode_floor_keeps_the_draft_lead() -> None:
    # W = 128, tpb = 128: a dummy of T tokens with d drafts and E extra holds
    # positions up to T + d + E with history T - 1, so its window reaches one
    # page further than (T, T - 1). Met exactly, the floor must still let the
    # bs = B warmup row be max_seq_len long.
    spec = load_model_spec("deepseek-v4-flash")
    limits = ServingLimits(
        max_batch_size=8, max_seq_len=8192, max_num_tokens=2048, max_draft_len=3, num_extra_kv_tokens=1
    )
    batch = longest_decode_batch(limits, limits.max_batch_size)
    assert batch[0] == Shape(8192 + 3 + 1, 8191) and batch[1:] == (Shape(5, 0),) * 7
    plan = plan_pools(spec, limits, kv_memory_bytes=20 * 2**30)
    floors = base_floors(spec)
    for c in plan.constraints:
        floors = merge_floors(floors, batch_floors(spec, c.batch))
    exact = plan_pools(spec, limits, kv_memory_bytes=pages_bytes(spec, floors))
    report = KVCacheManager(exact, enable_reuse=False).warmup((8,), (3,))
    assert report.lengths[(8, 3)] == 8192, report


def toy(window: int, tpb: int) -> ModelSpec:
    return model(
        group("full", "full", row_bytes=3, tpb=tpb),
        group("sliding", "sliding", row_bytes=5, tpb=tpb, window=window),
    )


@settings(max_examples=25, deadline=None)
@given(
    window=st.integers(1, 200),
    tpb=st.sampled_from([1, 4, 16, 32]),
    b=st.integers(1, 24),
    seq=st.integers(1, 600),
    n=st.one_of(st.none(), st.integers(1, 300)),
    d=st.integers(0, 3),
    e=st.integers(0, 2),
)
def test_random_profile_plans_hold_every_warmup_shape(
    window: int, tpb: int, b: int, seq: int, n: int | None, d: int, e: int
) -> None:
    limits = ServingLimits(max_batch_size=b, max_seq_len=seq, max_num_tokens=n, max_draft_len=d, num_extra_kv_tokens=e)
    spec = toy(window, tpb)
    plan = plan_pools(spec, limits, kv_memory_bytes=estimate_profile_bytes(spec, limits), phase="profile")
    assert_within_budget(plan)
    assert_holds_every_warmup_shape(plan, draft_len=d)
