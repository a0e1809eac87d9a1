"""Workload(lengths): the ratio from expected pages over a length distribution."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.errors import LimitsError
from kvpool.plan import ServingLimits, Workload, plan_pools, ratio_from_batch
from kvpool.spec import Shape
from plan_helpers import assert_within_budget, group, hybrid, model

LIMITS = ServingLimits(max_seq_len=32768)


def test_samples_every_step_of_a_short_output() -> None:
    # Prompt 10, output 3: decode steps at lengths 11, 12, 13, one request-step each.
    values, weights = Workload([(10, 3)]).length_weights(32768)
    assert values.tolist() == [11, 12, 13] and weights.tolist() == [1.0, 1.0, 1.0]


def test_long_outputs_are_sampled_evenly_and_weighted_by_steps() -> None:
    # Output 32 with 16 samples: sample j at step floor((j + 0.5) * 2) = 2j + 1,
    # length 100 + 2j + 2, each standing for 2 steps.
    values, weights = Workload([(100, 32)], samples=16).length_weights(32768)
    assert values.tolist() == [102 + 2 * j for j in range(16)]
    assert weights.tolist() == [2.0] * 16


def test_lengths_are_clipped_to_max_seq_len() -> None:
    values, weights = Workload([(5000, 2)]).length_weights(4096)
    assert values.tolist() == [4096] and weights.tolist() == [2.0]


def test_sliding_need_saturates_at_the_window_and_full_need_does_not() -> None:
    spec = hybrid()  # full + sliding(1024), equal row bytes, 32-token pages
    # (100, 1): one decode at length 101, shape (101, 100): full ceil(101/32) = 4,
    # sliding 4 (window not passed).  (4000, 1): shape (4001, 4000): full 126;
    # sliding 126 - floor((4000 + 1 - 1024)/32) = 126 - 93 = 33.
    assert Workload([(100, 1)]).expected_pages(spec, LIMITS) == {"full": 4, "sliding": 4}
    mix = Workload([(100, 1), (4000, 1)])
    assert mix.expected_pages(spec, LIMITS) == {"full": 130, "sliding": 37}
    assert mix.ratio(spec, LIMITS)["full"] == pytest.approx(130 / 167)
    # One mean length (2050.5 -> a 2051-position decode) would give full
    # 65 : sliding 65 - floor(1027/32) = 33, i.e. far less for the full pool.
    mean = ratio_from_batch(spec, [Shape(2051, 2050)])
    assert mean["full"] == pytest.approx(65 / 98)
    assert mix.ratio(spec, LIMITS)["full"] > mean["full"] + 0.1


def test_state_groups_count_one_slot_per_request_step() -> None:
    spec = model(group("full", row_bytes=1, tpb=4), group("state", "state", tpb=4, state_bytes=8))
    # (3, 1): decode at length 4: full 1 page of 4 B; state 1 slot of 8 B.
    assert Workload([(3, 1)]).ratio(spec, ServingLimits()) == pytest.approx({"full": 1 / 3, "state": 2 / 3})


def test_plan_with_a_workload_policy() -> None:
    lengths = np.array([[1000, 200], [3000, 50], [200, 800]])
    plan = plan_pools(hybrid(), LIMITS, kv_memory_bytes=2**30, policy=Workload(lengths))
    assert plan.policy == "workload" and plan.constraints == ()
    assert plan.ratio == pytest.approx(Workload(lengths).ratio(plan.spec, LIMITS))
    assert_within_budget(plan)


def test_workload_and_pool_ratio_together_are_refused() -> None:
    with pytest.raises(LimitsError, match="not both"):
        plan_pools(
            hybrid(), LIMITS, kv_memory_bytes=2**30, policy=Workload([(1, 1)]), pool_ratio={"full": 0.5, "sliding": 0.5}
        )


@pytest.mark.parametrize("bad", [[], [(1, 2, 3)], [(-1, 5)], [(0, 0)], [(1.5, 2.0)]])
def test_bad_lengths_are_limits_errors(bad: list[tuple[float, ...]]) -> None:
    with pytest.raises(LimitsError):
        Workload(bad)  # type: ignore[arg-type]
