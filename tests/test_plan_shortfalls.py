"""What an infeasible or ratio-forced plan says it is short of: the true pages
missing, derived here by hand."""

from __future__ import annotations

import pytest

from kvpool.errors import InfeasiblePlanError
from kvpool.plan import ServingLimits, plan_pools
from kvpool.spec import load_model_spec

MiB = 2**20
LIMITS = ServingLimits(max_batch_size=256, max_seq_len=32768, max_num_tokens=8192)

# gemma-3-27b, BF16 KV, 32-token pages: 16 KV heads x 128 dims x 2 (K, V) x 2 bytes
# = 8,192 B per layer and position. 52 sliding layers -> 425,984 B per position,
# 13,631,488 B per page; 10 full layers -> 81,920 B per position, 2,621,440 B per page.
GEMMA3_SLIDING_PAGE = 52 * 8192 * 32
GEMMA3_FULL_PAGE = 10 * 8192 * 32


def test_gemma3_page_sizes_are_the_hand_derived_ones() -> None:
    spec = load_model_spec("gemma-3-27b")
    assert spec.tokens_per_block == 32
    assert {g.name: g.slot_bytes for g in spec.groups} == {"sliding": GEMMA3_SLIDING_PAGE, "full": GEMMA3_FULL_PAGE}


def test_budget_below_one_page_per_group_reports_the_true_shortfall() -> None:
    # one page of each needs 16,252,928 B; 1 MiB leaves 15,204,352 B missing,
    # 1.12 sliding pages -> 2 whole sliding pages short (not 1)
    missing = GEMMA3_SLIDING_PAGE + GEMMA3_FULL_PAGE - MiB
    expected = -(-missing // GEMMA3_SLIDING_PAGE)
    assert expected == 2
    with pytest.raises(InfeasiblePlanError) as info:
        plan_pools(load_model_spec("gemma-3-27b"), LIMITS, kv_memory_bytes=MiB)
    e = info.value
    assert (e.constraint, e.group, e.short_pages) == ("one_page_per_group", "sliding", 2)
    assert "2 pages" in str(e)


def test_a_budget_one_byte_short_of_one_page_each_is_one_page_short() -> None:
    budget = GEMMA3_SLIDING_PAGE + GEMMA3_FULL_PAGE - 1
    with pytest.raises(InfeasiblePlanError) as info:
        plan_pools(load_model_spec("gemma-3-27b"), LIMITS, kv_memory_bytes=budget)
    assert info.value.short_pages == 1


# ------------------------------------------------------------- explicit --pool-ratio

S_LIMITS = ServingLimits(max_batch_size=256, max_seq_len=32768, max_num_tokens=8192, avg_seq_len=4096)
GiB = 2**30


def test_an_explicit_ratio_that_leaves_a_floor_unmet_warns_with_the_pages_short() -> None:
    spec = load_model_spec("gemma-3-27b")
    # with S the context floor applies: the engine's context warmup, N = 8192 prompt
    # tokens and the first generated token with no history, holds ceil(8193 / 32) =
    # 257 pages in every group (the window is 1024 < 8193, but a chunk's own positions
    # all need pages while it is computed)
    honest = plan_pools(spec, S_LIMITS, kv_memory_bytes=40 * GiB)
    assert [c.name for c in honest.constraints] == ["context"]
    assert honest.pages("sliding") >= 257
    # 5% of 40 GiB is 2,147,483,648 B = 157.5 sliding pages -> 157 whole pages
    plan = plan_pools(spec, S_LIMITS, kv_memory_bytes=40 * GiB, pool_ratio={"full": 0.95, "sliding": 0.05})
    assert plan.constraints == ()  # the ratio still opts out of the floors
    assert plan.pages("sliding") == int(0.05 * 40 * GiB) // GEMMA3_SLIDING_PAGE == 157
    # the warmup shapes it leaves unmet: the context dummy (257 pages) and the batch of
    # B = 256 minimal decodes (256 pages), said first with the split that holds them
    missed = {c.name: dict(c.short) for c in plan.guarantees if not c.satisfied}
    assert missed == {"warmup_context": {"sliding": 257 - 157}, "warmup_batch": {"sliding": 256 - 157}}
    first = plan.warnings[0]
    assert "context warmup of 8193 positions (short {'sliding': 100})" in first, first
    assert plan.advice is not None and plan.advice.pool_ratio is not None
    split = plan_pools(spec, S_LIMITS, kv_memory_bytes=40 * GiB, pool_ratio=dict(plan.advice.pool_ratio))
    assert all(c.satisfied for c in split.guarantees) and split.pages("sliding") >= 257


def test_an_explicit_ratio_that_meets_every_floor_adds_no_such_warning() -> None:
    plan = plan_pools(
        load_model_spec("gemma-3-27b"), S_LIMITS, kv_memory_bytes=40 * GiB, pool_ratio={"full": 0.5, "sliding": 0.5}
    )
    assert plan.pages("sliding") >= 257 and plan.pages("full") >= 257
    assert not [w for w in plan.warnings if "floor unmet" in w or "cannot hold" in w]


def test_the_cli_prints_the_unmet_floor(capsys: pytest.CaptureFixture[str]) -> None:
    from kvpool.cli.main import main

    assert (
        main(
            [
                "plan",
                "gemma-3-27b",
                "--kv-memory",
                "40GiB",
                "--max-seq-len",
                "32768",
                "--avg-seq-len",
                "4096",
                "--pool-ratio",
                "full=0.95,sliding=0.05",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    text = out.out + out.err
    assert "context warmup of 8193 positions (short {'sliding': 100})" in text and "--pool-ratio" in text
