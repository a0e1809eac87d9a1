"""The occupancy ratio: pages x steps in flight, prefill chunks included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import LimitsError
from kvpool.plan import ServingLimits, Workload, plan_pools
from kvpool.plan.occupancy import Occupancy
from kvpool.spec import ModelSpec, load_model_spec


def gemma() -> ModelSpec:
    return load_model_spec("gemma-3-27b", max_seq_len=8192).with_tokens_per_block(32)


def test_pages_by_hand() -> None:
    """One request of 2,048 prompt and 3 output tokens, chunks of 1,024 (N = 1024, no
    decodes in the step), window 1,024, 32 tokens per page:
    prefill (1024, 0) + (2048, 1024): full 32 + 64, sliding 32 + 64 (nothing stale yet);
    decodes at 2049 and 2050 positions: full 65 + 65, sliding 33 + 33."""
    limits = ServingLimits(max_seq_len=8192, max_num_tokens=1024)
    occ = Occupancy([(2048, 3)], decode_share=0.0)
    assert occ.chunk_tokens(limits) == 1024
    assert occ.expected_pages(gemma(), limits) == {"full": 32 + 64 + 130, "sliding": 32 + 64 + 66}
    assert occ.phase_steps(limits) == (2.0, 2.0)
    assert "1024 tokens" in occ.assumptions(limits)


def test_no_budget_prefills_in_one_step_and_long_prompts_are_left_out() -> None:
    limits = ServingLimits(max_seq_len=4096, max_num_tokens=None)
    occ = Occupancy([(100, 1), (5000, 10)])  # the second cannot run: prompt >= L
    assert occ.chunk_tokens(limits) is None
    assert occ.expected_pages(gemma(), limits) == {"full": 4, "sliding": 4}
    with pytest.raises(LimitsError, match="every prompt"):
        Occupancy([(5000, 1)]).ratio(gemma(), limits)
    with pytest.raises(LimitsError, match="decode_share"):
        Occupancy([(1, 1)], decode_share=2)


def test_long_outputs_match_workload() -> None:
    """With outputs much longer than prompts the prefill steps are a rounding error,
    so the ratio is the workload one."""
    limits = ServingLimits(max_seq_len=32768)
    pairs = [(100, 4000), (300, 8000), (50, 2000)]
    occ = Occupancy(pairs).ratio(gemma(), limits)
    wl = Workload(pairs).ratio(gemma(), limits)
    assert occ["sliding"] == pytest.approx(wl["sliding"], abs=0.01)


def test_prefill_chunks_weigh_on_summarisation() -> None:
    """Long prompts and one-token answers: the decode-only workload model sees a
    decode per request, occupancy sees chunks of 8,064 tokens that each hold a
    window plus the chunk in the sliding group: a larger sliding share."""
    limits = ServingLimits(max_seq_len=32768)
    pairs = [(30000, 2)] * 3
    assert Occupancy(pairs).ratio(gemma(), limits)["sliding"] > Workload(pairs).ratio(gemma(), limits)["sliding"] + 0.05
    plan = plan_pools(gemma(), limits, kv_memory_bytes=8 << 30, policy=Occupancy(pairs))
    assert plan.policy == "occupancy"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9000), st.integers(1, 3000)), min_size=1, max_size=8))
def test_ratio_is_a_distribution(pairs: list[tuple[int, int]]) -> None:
    limits = ServingLimits(max_seq_len=8192)
    if all(p >= 8192 for p, _ in pairs):
        return
    ratio = Occupancy(np.array(pairs)).ratio(gemma(), limits)
    assert sum(ratio.values()) == pytest.approx(1.0)
    assert all(0 < v < 1 for v in ratio.values())
