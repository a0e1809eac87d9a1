"""What a plan reports: concurrency, batch checks, graph-padding warnings, and
the limits helpers other layers use."""

from __future__ import annotations

import pytest

from kvpool.errors import LimitsError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.plan.report import graph_padding_pages, plan_warnings
from kvpool.spec import Shape
from plan_helpers import assert_pages, hybrid


def small_plan(full: int, sliding: int, **limits: int) -> PoolPlan:
    return PoolPlan.from_pages(hybrid(), {"full": full, "sliding": sliding}, ServingLimits(**limits))  # type: ignore[arg-type]


def test_max_concurrency_is_the_smallest_group_quotient() -> None:
    plan = small_plan(650, 330, max_seq_len=4096, max_draft_len=1)
    # Reference (2049, 2048): full 65, sliding 33 pages -> min(650 // 65, 330 // 33) = 10.
    # Decode at L = 4096, d = 1: shape (4096, 4094): full 128 pages -> 650 // 128 = 5;
    # sliding 128 - floor((4094 + 1 - 1024)/32) = 128 - 95 = 33 -> 10. min = 5.
    assert plan.max_concurrency() == {"reference": 10, "avg_seq_len": None, "max_seq_len": 5}
    assert plan.max_requests(Shape(1, 0)) == 330


def test_check_reports_pages_short_per_group() -> None:
    plan = small_plan(100, 40)
    # Two decodes at 2048 (history 2047): full 64 each -> 128 > 100 (28 short);
    # sliding 64 - floor((2047 + 1 - 1024)/32) = 64 - 32 = 32 each -> 64 > 40 (24 short).
    result = plan.check("two", (Shape(2048, 2047),) * 2)
    assert not result.satisfied and dict(result.short) == {"full": 28, "sliding": 24}
    assert plan.check("one", (Shape(2048, 2047),)).satisfied


def test_graph_padding_warning_names_the_group_that_cannot_hold_it() -> None:
    # W = 1024, tpb = 32, headroom 1: a full-window decode holds 33 sliding pages.
    # Largest graph batch 8 -> 8 x 33 = 264 sliding pages needed.
    limits = {"max_batch_size": 8, "max_seq_len": 4096}
    plan = small_plan(10_000, 263, **limits)
    assert graph_padding_pages(plan, "sliding") == 33
    assert graph_padding_pages(plan, "full") == 1  # a minimal decode of 1 position
    (warning,) = plan_warnings(plan)
    assert "'sliding' holds 7 decodes of 33 pages" in warning and "batch is 8" in warning
    assert plan_warnings(small_plan(10_000, 264, **limits)) == ()


def test_a_request_at_max_seq_len_that_never_fits_is_warned() -> None:
    plan = small_plan(10, 1000, max_batch_size=1, max_seq_len=4096)
    assert any("max_seq_len 4096" in w for w in plan_warnings(plan))


def test_from_pages_keeps_working() -> None:
    plan = small_plan(3, 5)
    assert_pages(plan, {"full": 3, "sliding": 5})
    assert plan.total_bytes == 8 * 32 * 1024 and plan.policy == "manual"


def test_clamped_limits_stay_valid() -> None:
    limits = ServingLimits(max_batch_size=64, max_seq_len=4096, avg_seq_len=2048, cuda_graph_batch_sizes=(1, 8, 64))
    small = limits.clamped(max_batch_size=4, max_seq_len=1000)
    assert (small.max_batch_size, small.max_seq_len, small.avg_seq_len) == (4, 1000, 1000)
    assert small.graph_batch_sizes == (1,)
    assert limits.clamped(max_batch_size=8).graph_batch_sizes == (1, 8)
    assert ServingLimits(max_batch_size=1000).largest_graph_batch == 256
    with pytest.raises(LimitsError):
        ServingLimits(max_batch_size=4, cuda_graph_batch_sizes=(8,))
