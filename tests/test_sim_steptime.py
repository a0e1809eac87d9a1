"""The step-time model, with every number derived by hand in the test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvpool.errors import KvpoolError
from kvpool.sim.steptime import (
    KERNELS_PER_LAYER,
    KERNELS_PER_STEP,
    LAUNCH_S,
    REPLAY_S,
    StepTimeModel,
    Weights,
    load_weights,
)
from kvpool.spec import RULES, LayerGroup, ModelSpec, load_model_spec, register_kind
from kvpool.spec.kinds import Full, Life
from sim_helpers import toy_gpu

GPU = toy_gpu(fp8_flops=2e14)


def toy_spec(**extra: object) -> ModelSpec:
    # 2 layers, 4 query heads, 2 KV heads of dim 16, BF16:
    # K and V = 2 x 2 heads x 16 values x 2 bytes = 128 bytes per position per layer.
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_size": 64,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        **extra,
    }
    return load_model_spec(config, tokens_per_block=4)


def toy_model(weights: Weights | None = None, **extra: object) -> StepTimeModel:
    # the roofline model: every number below is derived by hand from its formula
    return StepTimeModel.build(toy_spec(**extra), GPU, weights or Weights(1e9, 1e9, 2.0), "roofline")


EAGER = LAUNCH_S * (KERNELS_PER_LAYER * 2 + KERNELS_PER_STEP)


def test_decode_step_is_memory_bound_by_hand() -> None:
    model = toy_model()
    (group,) = model.groups
    assert group.row_bytes == 2 * 128  # both layers
    # attention FLOPs per (query, key) pair: 4 x 4 heads x 16 dims x 2 layers = 512
    assert group.flops_per_pair == 512
    # Two rows at history 10 and 20 read 11 + 21 = 32 keys.
    flops = 2 * 1e9 * 2 + 512 * 32  # 4.000016384e9 -> 40.0 us
    bytes_ = 2e9 + 256 * (32 + 2)  # weights + KV read + 2 rows written
    expected = max(flops / 1e14, bytes_ / 1e12)  # memory: 2.000008704 ms
    assert bytes_ / 1e12 > flops / 1e14
    assert model.time([(10, 0), (20, 0)], []) == pytest.approx(expected + EAGER, rel=1e-12)
    assert model.time([(10, 0), (20, 0)], [], graph=True, padded_batch=2) == pytest.approx(
        expected + REPLAY_S, rel=1e-12
    )


def test_eager_overhead_is_launches_per_kernel() -> None:
    # 2 layers x 10 kernels + 6 per step = 26 launches of 10 us
    assert toy_model().eager_overhead_s == pytest.approx(26 * 10e-6)


def test_graph_step_computes_its_padding_rows() -> None:
    model = toy_model(Weights(1e12, 1e12, 2.0))  # make compute matter: 2 TB of weights, 1e12 params
    # 3 rows padded to 4: compute counts 4 tokens; bytes are dominated by 2e12 weight bytes
    t = model.time([(0, 0)] * 3, [], graph=True, padded_batch=4)
    flops = 2 * 1e12 * 4 + 512 * 3
    bytes_ = 2e12 + 256 * (3 + 4)
    assert t == pytest.approx(max(flops / 1e14, bytes_ / 1e12) + REPLAY_S, rel=1e-12)


def test_prefill_chunk_is_compute_bound_by_hand() -> None:
    model = toy_model()
    # 1000 prompt tokens from position 0: causal pairs = 1 + 2 + ... + 1000 = 500500
    flops = 2 * 1e9 * 1000 + 512 * 500500
    bytes_ = 2e9 + 256 * (1000 + 1000)  # keys read once (1000) + 1000 rows written
    assert flops / 1e14 > bytes_ / 1e12
    assert model.time([], [(0, 1000)]) == pytest.approx(flops / 1e14 + EAGER, rel=1e-12)
    # a second chunk of 500 after 1000: pairs = 1001 + ... + 1500 = 500 x 2501 / 2
    assert model.chunk_pairs(model.groups[0], 1000, 500) == 500 * 2501 / 2


def test_sliding_chunk_pairs_match_brute_force() -> None:
    model = toy_model(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    sliding = next(g for g in model.groups if g.group.kind == "sliding")
    for start in range(0, 20):
        for n in range(1, 20):
            brute = sum(min(start + j + 1, 8) for j in range(n))
            assert model.chunk_pairs(sliding, start, n) == brute, (start, n)


@pytest.mark.parametrize("calibration", ["roofline", None])
def test_decode_run_times_equal_single_steps(calibration: str | None) -> None:
    spec = toy_spec(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    model = StepTimeModel.build(spec, GPU, Weights(1e9, 1e9, 2.0), calibration)  # None: shipped profile
    hist = [3, 9, 30]
    run = model.decode_run_times(hist, 5, graph=True, padded_batch=4)
    for j in range(5):
        single = model.time([(h + j, 0) for h in hist], [], graph=True, padded_batch=4)
        assert run[j] == pytest.approx(single, rel=1e-12), j


STEPS = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 2)), max_size=4),  # decode rows (history, drafts)
        st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 6)), max_size=3),  # prefill chunks (start, n)
        st.booleans(),  # graph
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(STEPS)
def test_a_model_prices_each_step_as_a_fresh_one_does(steps: list[tuple[Any, Any, bool]]) -> None:
    """The parts a model remembers per (tokens, sampled rows) pair change no
    figure: a model that priced steps before gives each step, part by part,
    exactly what a model that never priced one gives (MoE, so every part counts)."""
    spec = toy_spec(num_local_experts=4, num_experts_per_tok=2, intermediate_size=128)
    w = Weights(5e9, 2e9, 2.0, num_experts=4, experts_per_token=2)
    warm = StepTimeModel.build(spec, GPU, w)
    for decodes, prefills, graph in steps + steps:  # each step again, the memo now warm
        fresh = StepTimeModel.build(spec, GPU, w)
        padded = len(decodes) + 1 if graph and decodes else None
        got = warm.cost(decodes, prefills, graph=graph, padded_batch=padded)
        assert got == fresh.cost(decodes, prefills, graph=graph, padded_batch=padded)
        assert list(map(float, got)) == list(
            map(float, fresh.cost(decodes, prefills, graph=graph, padded_batch=padded))
        )
    assert got.experts > 0 and got.matmul > 0
    assert warm == StepTimeModel.build(spec, GPU, w)  # the memo is no part of the value


def test_moe_reads_the_experts_its_tokens_touch() -> None:
    # 4 experts, 1 per token: expert = (5e9 - 2e9) / 3 = 1e9 params, dense part 1e9
    w = Weights(5e9, 2e9, 1.0, num_experts=4, experts_per_token=1)
    model = toy_model(w)
    assert model.weight_bytes(1) == pytest.approx(2e9)  # one token: the active parameters
    # two tokens touch 4 x (1 - (3/4)^2) = 1.75 experts on average
    assert model.weight_bytes(2) == pytest.approx(1e9 + 1.75e9)
    assert model.weight_bytes(10_000) == pytest.approx(5e9)  # everything
    assert model.peak_flops == 2e14  # 1 byte per parameter: FP8 peak


def test_load_weights_from_facts_and_flags() -> None:
    w = load_weights("gemma-4-26b-a4b")
    assert (w.total_params, w.active_params, w.num_experts, w.experts_per_token) == (25.2e9, 3.8e9, 128, 8)
    w = load_weights("some/local/model", weights_bytes=16e9)
    assert (w.total_params, w.active_params, w.bytes_per_param) == (8e9, 8e9, 2.0)
    # a known MoE at another size keeps its active share: 3.8/25.2 of 12.6e9 params
    w = load_weights("gemma-4-26b-a4b", weights_bytes=25.2e9)
    assert w.total_params == pytest.approx(12.6e9) and w.active_params == pytest.approx(1.9e9)
    with pytest.raises(KvpoolError, match="--weights-bytes"):
        load_weights("no-such-model")
    with pytest.raises(KvpoolError, match="active params"):
        load_weights("qwen3-8b", active_params=1e12)


def test_every_bundled_model_with_params_builds() -> None:
    from kvpool.presets import load_gpu
    from kvpool.sim.steptime import params_table

    for name in params_table():
        model = StepTimeModel.build(load_model_spec(name), load_gpu("h100"), load_weights(name))
        t = model.decode_run_times([100, 2000], 3)
        assert np.all(t > 0) and np.all(np.diff(t) >= 0), name


class FullRowByRow(Full):
    """Full attention's keys (h + 1) from a `keys_read` of its own: the
    rule's sums take the general path, one row at a time."""

    name = "full_row_by_row"

    def keys_read(self, g: Life, history: Any) -> Any:
        return history + 1


ROW_BY_ROW = FullRowByRow()
# histories up to and past the closed forms' bound (2**53), a few out of range (negative) or not ints
HISTORY = st.one_of(
    st.integers(0, 5000),
    st.integers(2**52, 2**53 + 8),
    st.integers(2**53 - 8, 2**53 + 8),
    st.integers(-12, -1),
    st.floats(0, 1e4, allow_nan=False),
)


def rule_groups() -> list[LayerGroup]:
    """One group of each shipped kind and of `FullRowByRow`."""
    register_kind(ROW_BY_ROW)
    try:
        return [
            LayerGroup("f", "full", (0,), 4, row_bytes=8),
            LayerGroup("s", "sliding", (0,), 4, row_bytes=8, window=8),
            LayerGroup("c", "chunked", (0,), 4, row_bytes=8, window=8),
            LayerGroup("z", "compressed", (0,), 4, row_bytes=8, ratio=4),
            LayerGroup("r", "state", (0,), 4, state_bytes=8),
            LayerGroup("b", ROW_BY_ROW.name, (0,), 4, row_bytes=8),
        ]
    finally:
        RULES.pop(ROW_BY_ROW.name)


@settings(max_examples=300, deadline=None)
@given(st.lists(HISTORY, max_size=8))
@example([2**53 + 2, -10])  # a partial sum past 2**53 rounds, the total is under it
@example([2**52 + 1, 2**52 + 2, 1])  # partial sums past 2**53 round
def test_keys_read_sum_is_the_rows_added_one_by_one(histories: list[int]) -> None:
    """Every rule's sum is the float a loop over the rows adds from 0.0 (full
    attention's ints summed in C only where that float is exact)."""
    for group in rule_groups():
        loop = 0.0
        for h in histories:
            loop += group.rule.keys_read(group, h)
        got = group.rule.keys_read_sum(group, histories)
        assert type(got) is float and got == loop, (group.kind, histories)


def row_model(kind: str) -> StepTimeModel:
    """The calibrated model of a 2-layer toy whose one group is of `kind` (full attention's keys; a state)."""
    register_kind(ROW_BY_ROW)
    try:
        if kind == "state":
            group = LayerGroup("g", "state", (0, 1), 4, state_bytes=512)
        else:
            group = LayerGroup("g", kind, (0, 1), 4, row_bytes=256)
    finally:
        RULES.pop(ROW_BY_ROW.name)
    config = {"num_attention_heads": 4, "head_dim": 16, "hidden_size": 64}
    spec = ModelSpec("toy", "test", (group,), 4, "bf16", 1, 2, config=config)
    return StepTimeModel.build(spec, GPU, Weights(1e9, 1e9, 2.0))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(st.integers(0, 5000), st.integers(2**50, 2**53)), st.integers(0, 2)), max_size=5),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 6)), max_size=2),
    st.booleans(),
    st.integers(1, 40),
)
def test_full_attention_prices_as_row_by_row(
    decodes: list[tuple[int, int]], prefills: list[tuple[int, int]], graph: bool, steps: int
) -> None:
    """Full attention's closed-form key sums (a step's rows; a run's steps)
    give every part of a step and every step of a run bit for bit what the
    same keys asked row by row give."""
    fast, slow = row_model("full"), row_model(ROW_BY_ROW.name)
    padded = len(decodes) + 1 if graph and decodes else None
    assert fast.cost(decodes, prefills, graph=graph, padded_batch=padded) == slow.cost(
        decodes, prefills, graph=graph, padded_batch=padded
    )
    histories = [h for h, _ in decodes]
    run = fast.decode_run_times(histories, steps, graph=graph, padded_batch=padded).tolist()
    assert run == slow.decode_run_times(histories, steps, graph=graph, padded_batch=padded).tolist()
    if len(decodes) == 1 and histories[0] < 2**40:  # and each step of the run is the step priced alone
        assert run == [fast.time([(histories[0] + j, 0)], [], graph=graph, padded_batch=padded) for j in range(steps)]


@pytest.mark.parametrize("graph", [False, True])
def test_a_run_reading_no_keys_times_each_step(graph: bool) -> None:
    """A model whose groups read no keys (state only) prices a run's steps as
    floats alike: an array of the single step's time, one per step."""
    model = row_model("state")
    run = model.decode_run_times([5, 40], 4, graph=graph, padded_batch=2)
    assert isinstance(run, np.ndarray) and run.dtype == np.float64
    assert run.tolist() == [model.time([(5 + j, 0), (40 + j, 0)], [], graph=graph, padded_batch=2) for j in range(4)]
