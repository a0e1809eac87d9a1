"""The plan's CUDA-graph warnings and `kvpool warmup` are one computation
(`plan.capture` on the plan's page counts or on the manager): they agree on
random plans, and the warning names the safe graph sizes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.plan.plan_pages import plan_warmup
from kvpool.plan.report import plan_warnings, spans
from kvpool.spec import load_model_spec
from plan_helpers import group, model


def test_gemma3_warning_and_warmup_agree_on_the_safe_sizes() -> None:
    spec = load_model_spec("gemma-3-27b")
    limits = ServingLimits(max_batch_size=256, max_seq_len=32768, max_num_tokens=8192)
    plan = plan_pools(spec, limits, kv_memory_bytes=20 * 2**30)
    report = KVCacheManager(plan, enable_reuse=False).warmup(limits.graph_batch_sizes, (0,))
    assert not report.skipped  # every size is captured ...
    (warning,) = [w for w in plan.warnings if "'sliding'" in w]
    held = int(warning.split(" holds ")[1].split()[0])
    assert held < 256  # ... although fewer full-window decodes fit: the warning says both
    assert f"captures sizes all {len(limits.graph_batch_sizes)} (1..256)" in warning


def test_spans_collapse_runs_of_listed_sizes() -> None:
    sizes = (1, 2, 4, 8, 16, 24)
    assert spans([1, 2, 4], sizes) == "1..4"
    assert spans([1, 8, 16], sizes) == "1, 8..16"
    assert spans(sizes, sizes) == "all 6 (1..24)"
    assert spans([], sizes) == "none"


@st.composite
def plans(draw: st.DrawFn) -> PoolPlan:
    tpb = draw(st.sampled_from([1, 4, 16]))
    window = draw(st.integers(1, 80))
    spec = model(
        group("full", "full", row_bytes=2, tpb=tpb), group("sliding", "sliding", row_bytes=3, tpb=tpb, window=window)
    )
    b = draw(st.integers(1, 20))
    limits = ServingLimits(
        max_batch_size=b,
        max_seq_len=draw(st.integers(1, 400)),
        max_num_tokens=draw(st.one_of(st.none(), st.integers(1, 200))),
        max_draft_len=draw(st.integers(0, 3)),
        num_extra_kv_tokens=draw(st.integers(0, 2)),
        cuda_graph_batch_sizes=tuple(draw(st.sets(st.integers(1, b), min_size=1, max_size=6))),
    )
    pages = {"full": draw(st.integers(1, 300)), "sliding": draw(st.integers(1, 300))}
    return PoolPlan.from_pages(spec, pages, limits)


@settings(max_examples=60, deadline=None)
@given(plan=plans())
def test_warmup_on_the_plan_pages_equals_the_managers(plan: PoolPlan) -> None:
    drafts = sorted({0, plan.limits.max_draft_len})
    counted = plan_warmup(plan, drafts)
    real = KVCacheManager(plan, enable_reuse=False).warmup(plan.limits.graph_batch_sizes, drafts)
    assert counted.captured == real.captured
    assert counted.skipped == real.skipped
    assert counted.lengths == real.lengths
    assert counted.unfit == real.unfit
    assert counted.reserved_pages == real.reserved_pages
    assert {d: r is None for d, r in counted.padding.items()} == {d: r is None for d, r in real.padding.items()}
    assert counted.padding_short == real.padding_short
    # what the plan's warning calls safe is what the manager captured
    safe = [b for b, d in real.captured if d == plan.limits.max_draft_len]
    for w in plan_warnings(plan):
        if "safe sizes: " in w and f"(draft {plan.limits.max_draft_len})" in w:
            assert w.split("safe sizes: ")[1].startswith(spans(safe, plan.limits.graph_batch_sizes))
