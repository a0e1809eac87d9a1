"""TensorRT-LLM's own unit-test numbers for KV cache manager V2, reproduced by
`kvpool.engines.trtllm_v2`.

Inputs and expected values are in tests/data/trtllm/v2_tests.json, each with the
NVIDIA/TensorRT-LLM commit and file it comes from; the rest are worked examples
derived by hand (in the comments) from TensorRT-LLM's code as
tests/data/trtllm/README.md lists it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.engines import trtllm, trtllm_v2, trtllm_v2_executor
from kvpool.engines import trtllm_v2_storage as storage
from kvpool.engines.trtllm_v2 import V2Options
from kvpool.errors import LimitsError
from kvpool.plan import ServingLimits
from kvpool.spec import LayerGroup
from plan_helpers import group, hybrid, model

MiB, GiB = 1 << 20, 1 << 30
DATA = json.loads((Path(__file__).parent / "data" / "trtllm" / "v2_tests.json").read_text())


def _batch(rows: list[list[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((c, h) for c, h in rows)


@pytest.mark.parametrize("case", DATA["executor_batches"], ids=lambda c: c["source"].rsplit("::", 1)[1])
def test_executor_typical_step_and_constraints(case: dict[str, Any]) -> None:
    typical, constraints = trtllm_v2_executor.executor_batches(**case["inputs"])
    expected = case["typical_step"]
    assert typical == (None if expected is None else _batch(expected))
    if case.get("constraints") is not None:
        assert constraints == tuple(_batch(b) for b in case["constraints"])
    if "constraint_1" in case:
        assert constraints[1] == _batch(case["constraint_1"])


def test_executor_refuses_avg_seq_len_past_max_seq_len() -> None:
    case = DATA["avg_seq_len_too_long"]
    with pytest.raises(LimitsError, match=case["raises_mentioning"]):
        trtllm_v2_executor.executor_batches(**case["inputs"])


def test_ssm_only_pool_holds_quota_over_slot() -> None:
    # TestSSMSupport: one SSM layer of a 2 MiB buffer, GPU quota 2 x 2 MiB -> 2 slots
    case = DATA["ssm_only_pool"]["inputs"]
    spec = model(group("ssm", "state", state_bytes=case["ssm_buffer_bytes"], tpb=case["tokens_per_block"]))
    sizing = trtllm_v2.size(spec, case["gpu_quota"], V2Options(max_util_for_resume=case["max_util_for_resume"]))
    assert [n for *_, n in sizing.pool_groups] == [DATA["ssm_only_pool"]["gpu_slots"]]


def test_sink_block_joins_the_sliding_floor() -> None:
    # TestResizeQuota: "(1+5+n), 1 is for sink blocks, 5 is for SWA (window=128)" at 32 tokens per block
    case = DATA["sink_window_floor"]
    i = case["inputs"]
    assert trtllm_v2.sliding_floor(i["window"], i["tokens_per_block"], i["sink_tokens"]) == case["blocks"]
    assert trtllm_v2.sliding_floor(i["window"], i["tokens_per_block"]) == case["blocks"] - 1


def test_constraint_floor_scaled_by_max_util_for_resume_nvbug_6625710() -> None:
    # test_nvbug_6625710.py: a pool group needing 129 slots for the warmup batch held ceil(129 / 0.95) = 136.
    # By hand: window 32 widened by a draft length of 1 (W 33), 32 tokens per block, B 128; the warmup
    # constraint [(2048, 2047)] + 127 x [(8, 0)]: the long request keeps 64 - (2048 - 33) // 32 = 2 blocks,
    # each short one 1 -> 129 slots -> 136.
    b, length = 128, 2048
    warmup = ((length, length - 1), *[(8, 0)] * (b - 1))
    spec = model(group("sliding", "sliding", row_bytes=1024, window=32), group("full", row_bytes=2048))
    sizing = trtllm_v2.size(spec, GiB, V2Options(constraints=(warmup,), window_extra=1))
    floors = {names: floor for names, _, floor, _, _ in sizing.pool_groups}
    assert floors[("sliding",)] == DATA["nvbug_6625710_instantaneous_floor"]["floor"]
    # the full life cycle: 64 blocks for the long request, 1 per short one -> ceil(191 / 0.95) = 202
    assert floors[("full",)] == 202


def test_max_util_for_resume_is_a_float32() -> None:
    # storageManager.cpp divides by a float max_util_for_resume: 19 slots / 0.95f = 20.0000003 -> 21
    # (in double arithmetic 19 / 0.95 is 20.0)
    spec = model(group("full", row_bytes=1024))
    constraint = ((19 * 32, 0),)
    sizing = trtllm_v2.size(spec, GiB, V2Options(constraints=(constraint,)))
    assert sizing.pool_groups[0][2] == 21
    exact = trtllm_v2.size(spec, GiB, V2Options(constraints=(constraint,), max_util_for_resume=1.0))
    assert exact.pool_groups[0][2] == 19


def test_executor_test_manager_floors_and_slots() -> None:
    # The executor test's manager: one full-attention layer of 128 bytes per token (K only), 128 tokens per
    # block, GPU quota 1 GiB, B 3, L 1024, N 2048, d 2, S 1024. Constraint A holds 1024 / 128 = 8 + 1 + 1 = 10
    # slots, B 2048 / 128 = 16; scaled by 1 / 0.95f: 11 and 17, so the floor is 17. One pool group takes the
    # whole quota: 1 GiB at 2 MiB grains / (128 x 128 B) = 65,536 slots.
    typical, constraints = trtllm_v2_executor.executor_batches(
        max_batch_size=3, max_seq_len=1024, max_num_tokens=2048, max_draft_len=2, avg_seq_len=1024
    )
    spec = model(group("full", row_bytes=128, tpb=128))
    sizing = trtllm_v2.size(spec, GiB, V2Options(typical_step=typical, constraints=constraints))
    assert sizing.ratio_from == "typical step" and sizing.granularity == 2 * MiB
    assert [(floor, n) for *_, floor, _, n in sizing.pool_groups] == [(17, 65_536)]


def test_full_attention_floor_is_the_largest_sliding_floor() -> None:
    # storageManager.cpp computeSlotsFromConstraints: full-attention life cycles share the largest SWA floor
    # (W 1024, tpb 32: 1024 + 30 = 1054 // 32 = 32, + 1 = 33); a state life cycle's floor is 1
    spec = model(
        group("full", row_bytes=1024),
        group("sliding", "sliding", row_bytes=2048, window=1024),
        group("local", "sliding", row_bytes=4096, window=128),
        group("ssm", "state", state_bytes=4096),
    )
    assert trtllm_v2.life_cycle_floors(spec) == {"full": 33, "sliding": 33, "local": 5, "ssm": 1}
    assert trtllm_v2.life_cycle_floors(model(group("full", row_bytes=1024))) == {"full": 1}


def test_typical_step_at_max_seq_len_starves_the_sliding_pool() -> None:
    # The Gemma-4 regression the allocator fallback fixed: 5 full and 25 sliding layers alike (256 KiB per
    # token each), tpb 32, W 1024, B 256, N 8192, L 8192. Fallback: full 65 x 5 = 325, sliding 33 x 25 = 825
    # units -> full 28 % (at 32 MiB grains: 2,600 MiB -> 82 grains, 6,600 MiB -> 207: 28.4 %). Typical step
    # at S = L: [(8192, 0)] + 255 x [(8192, 8191)]: full 256 x 256 x 5 = 327,680; sliding
    # (256 + 255 x (256 - (8192 - 1024) // 32)) x 25 = (256 + 255 x 32) x 25 = 210,400 -> full 60.9 %.
    spec = hybrid(full_row=5 * 256 * 1024, sliding_row=25 * 256 * 1024, window=1024)
    typical, constraints = trtllm_v2_executor.executor_batches(
        max_batch_size=256, max_seq_len=8192, max_num_tokens=8192, avg_seq_len=8192
    )

    def full_share(options: V2Options) -> float:
        sizing = trtllm_v2.size(spec, 200 * GiB, options)
        assert not sizing.inflated
        by_name = {names: slot * n for names, slot, _, _, n in sizing.pool_groups}
        return by_name[("full",)] / sum(by_name.values())

    assert full_share(V2Options()) == pytest.approx(82 / 289, abs=0.002)
    assert full_share(V2Options(typical_step=typical, constraints=constraints)) == pytest.approx(
        327_680 / 538_080, abs=0.002
    )


def test_fallback_ratio_rounds_each_life_cycle_to_a_grain() -> None:
    # Each life cycle's bytes are rounded up to the granularity before the ratio: at 1 KiB per token, the
    # fallback request holds 65 x 32 KiB (full) and 33 x 32 KiB x 5 (sliding), both under one 32 MiB grain,
    # so at 200 GiB V2 splits the quota 1 : 1 whatever the layer mix.
    spec = hybrid(full_row=1024, sliding_row=5 * 1024, window=1024)
    sizing = trtllm_v2.size(spec, 200 * GiB)
    assert [g for *_, g, _ in sizing.pool_groups] == [3200, 3200]


def test_max_tokens_caps_the_quota() -> None:
    # _get_quota_from_max_tokens(T) = T x full + B x ceil(W / tpb) x tpb x swa + min(T, N) x swa, then
    # / max_util_for_resume. Full and sliding 1 KiB per token each, W 1024, tpb 32, B 4, N 8192, T 10,000:
    # 10,240,000 + 4,194,304 + 8,388,608 = 22,822,912 -> / 0.95 = 24,024,117.9 -> 24,024,118 bytes (x 0.95 = 22,822,912.1), under the
    # 1 GiB budget: 2 MiB grains, 12 of them; one pool group (equal slots of 32 KiB) -> 768 slots.
    spec = hybrid(full_row=1024, sliding_row=1024, window=1024)
    options = V2Options(max_tokens=10_000, max_num_tokens=8192, max_batch_size=4)
    assert trtllm_v2.quota_from_max_tokens(spec, options) == 22_822_912
    sizing = trtllm_v2.size(spec, GiB, options)
    assert sizing.capped_by_max_tokens and sizing.quota_bytes == 24_024_118
    assert sizing.grains == 12 and sizing.pool_groups[0][4] == 12 * 2 * MiB // (32 * 1024)
    assert not trtllm_v2.size(spec, 16 * MiB, options).capped_by_max_tokens  # a smaller budget wins


def test_deepseek_v4_windows_widened_by_the_draft_length() -> None:
    # deepseek_v4/cache_manager.py _get_window_size: SWA W + d; compressor state factor x ratio + d with
    # factor 2 for the overlapping ratio-4 compressor; the compressed cache has no window
    assert trtllm_v2_executor.deepseek_v4_window("swa", 1, 128, 3) == 131
    assert trtllm_v2_executor.deepseek_v4_window("compressor", 4, 128, 3) == 11
    assert trtllm_v2_executor.deepseek_v4_window("compressor", 128, 128, 0) == 128
    assert trtllm_v2_executor.deepseek_v4_window("compress", 4, 128, 3) is None
    with pytest.raises(LimitsError):
        trtllm_v2_executor.deepseek_v4_window("indexer", 4, 128, 3)


def test_deepseek_v4_batches_default_to_max_seq_len() -> None:
    # test_typical_seq_len_preserves_deepseek_v4_fallback: no avg_seq_len -> max_seq_len, 256 -> 256
    typical, constraints = trtllm_v2_executor.deepseek_v4_batches(
        max_batch_size=3, max_seq_len=1024, max_num_tokens=2048, max_draft_len=2
    )
    assert typical == ((2048, 0), (1024, 1021), (1024, 1021))
    assert constraints == (((1024, 1023),), ((2048, 0),))
    typical, _ = trtllm_v2_executor.deepseek_v4_batches(
        max_batch_size=2, max_seq_len=1024, max_draft_len=2, avg_seq_len=256
    )
    assert typical == ((256, 0), (256, 253))


def test_window_extra_widens_sliding_slots() -> None:
    # one request at (2048, 2047), W 1024 at tpb 32: 64 - (2048 - 1024) // 32 = 32 blocks; widened by 3
    # (W 1027): 64 - (2048 - 1027) // 32 = 33
    g = group("sliding", "sliding", window=1024)
    assert trtllm_v2.life_cycle_blocks(g, 2048, 2047, 32) == 32
    assert trtllm_v2.life_cycle_blocks(g, 2048, 2047, 32, window_extra=3) == 33


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 64),
    length=st.integers(64, 8192),
    util=st.sampled_from([0.5, 0.9, 0.95, 0.97, 1.0]),
    quota=st.integers(64 * MiB, 64 * GiB),
)
def test_constraint_floors_hold_every_constraint(b: int, length: int, util: float, quota: int) -> None:
    typical, constraints = trtllm_v2_executor.executor_batches(
        max_batch_size=b, max_seq_len=length, max_num_tokens=2048, avg_seq_len=length // 2
    )
    spec = hybrid(full_row=1024, sliding_row=4096, window=512)
    sizing = trtllm_v2.size(
        spec, quota, V2Options(typical_step=typical, constraints=constraints, max_util_for_resume=util)
    )
    by_name = {names[0]: (floor, n) for names, _, floor, _, n in sizing.pool_groups}
    for batch in constraints:
        for g in spec.groups:
            floor, slots = by_name[g.name]
            assert slots >= floor >= trtllm_v2.batch_slots(g, batch, 32)
    if not sizing.inflated:
        assert sum(g for *_, g, _ in sizing.pool_groups) <= sizing.grains


def test_v2_typical_manager_uses_the_executor_batches() -> None:
    # trtllm.allocate(manager="v2-typical") is V2 given avg_seq_len: the executor's typical step and
    # constraints from the limits (B 3, L 1024, N 2048, d 2, S 1024 as the executor test), so the full
    # life cycle's floor is test_executor_test_manager_floors_and_slots's 17
    spec = model(group("full", row_bytes=128, tpb=128))
    lim = ServingLimits(max_seq_len=1024, max_batch_size=3, max_num_tokens=2048, max_draft_len=2, avg_seq_len=1024)
    report = trtllm.allocate(spec, lim, GiB, manager="v2-typical")
    assert "typical step" in report.version_modelled and report.group_pages == {"full": 65_536}
    assert trtllm_v2_executor.options_for(lim, avg_seq_len=1024).constraints[0][1:] == ((3, 0), (3, 0))
    with pytest.raises(LimitsError, match="avg_seq_len"):
        trtllm.allocate(spec, ServingLimits(max_seq_len=1024), GiB, manager="v2-typical")


def test_pool_ratio_replaces_the_ratio_and_is_checked() -> None:
    # storageManager.cpp: initial_pool_ratio must have one positive share per life cycle, summing to 1;
    # it replaces the ratio. Full 32 KiB and sliding 64 KiB slots, 1 GiB in 2 MiB grains = 512, ratio
    # 0.25 / 0.75: the smaller share first, round(512 x 0.25) = 128 grains -> 128 x 2 MiB // 32 KiB = 8,192
    # full slots; the sliding group the other 384 grains -> 384 x 2 MiB // 64 KiB = 12,288.
    spec = hybrid(full_row=1024, sliding_row=2048, window=1024)
    sizing = trtllm_v2.size(spec, GiB, V2Options(pool_ratio=(0.25, 0.75)))
    assert sizing.ratio_from == "pool_ratio"
    assert {names: n for names, _, _, _, n in sizing.pool_groups} == {("full",): 8192, ("sliding",): 12_288}
    for bad in ((0.5, 0.6), (1.0, 0.0), (-0.5, 1.5)):
        with pytest.raises(LimitsError, match="pool_ratio"):
            V2Options(pool_ratio=bad)
    with pytest.raises(LimitsError, match="life cycles"):
        trtllm_v2.size(spec, GiB, V2Options(pool_ratio=(1.0,)))


def test_block_quant_buffers_are_two_pools_of_one_pool_group() -> None:
    # test_storage_manager.py: 2 layers of K = V = 8192 B and two 512 B block-quant buffers per block coalesce
    # into one life cycle, one pool group, pools [2 x 2 x 8192, 2 x 2 x 512] (largest first)
    case = DATA["block_quant_two_pools"]
    inputs, tpb = case["inputs"], case["inputs"]["tokens_per_block"]
    kv, bq = inputs["kv_buf_size"] // tpb, inputs["block_quant_buf_size"] // tpb
    layers = tuple(range(inputs["layers"]))
    g = LayerGroup("full", "full", layers, tpb, row_bytes=(2 * kv + 2 * bq) * len(layers), buffers=(kv, kv, bq, bq))
    spec = model(g)
    cycles = storage.life_cycles(spec)
    assert len(cycles) == case["life_cycles"]
    assert list(storage.pool_groups(cycles)) == [tuple(case["slot_sizes"])]


@pytest.mark.parametrize("case", DATA["cold_codec_hot_slots"], ids=lambda c: c["source"].rsplit("::", 1)[1])
def test_hot_pool_groups_of_the_cold_codec_tests(case: dict[str, Any]) -> None:
    # one KEY buffer per layer of key_bytes per block; initial_pool_ratio, one constraint, max_util_for_resume 1.0:
    # the hot tier's slot count of each layer's pool group is the test's `total`
    inputs = case["inputs"]
    tpb = inputs["tokens_per_block"]
    groups = tuple(
        LayerGroup(
            f"l{i}",
            "full" if w is None else "sliding",
            (i,),
            tpb,
            row_bytes=key // tpb,
            window=w,
            buffers=(key // tpb,),
        )
        for i, (key, w) in enumerate(zip(inputs["key_bytes"], inputs["windows"], strict=True))
    )
    options = V2Options(
        constraints=(_batch(inputs["constraint"]),),
        pool_ratio=tuple(inputs["initial_pool_ratio"]),
        max_util_for_resume=inputs["max_util_for_resume"],
    )
    sizing = trtllm_v2.size(model(*groups), inputs["gpu_quota"], options)
    slots = {name: n for names, _, _, _, n in sizing.pool_groups for name in names}
    assert [slots[g.name] for g in groups] == case["hot_totals_by_layer"]


def test_water_filling_keeps_every_floor_at_the_floors_quota() -> None:
    # ratio_to_slot_count_list at exactly the grains the floors take: every pool group keeps its floor
    case = DATA["ratio_to_slot_count_list_preserves_min_slots"]["inputs"]
    gran, floors = case["granularity"], case["min_slots"]
    sizes = [tuple(s) for s in case["slot_size_lists"]]
    total = sum(storage.grains_for_slots(f, s, gran) for f, s in zip(floors, sizes, strict=True))
    ratio = [np.float32(r) for r in case["ratio_list"]]
    slots = storage.water_fill(total, gran, sizes, ratio, floors)
    assert all(n >= f for n, f in zip(slots, floors, strict=True))
    assert sum(storage.grains_for_slots(n, s, gran) for n, s in zip(slots, sizes, strict=True)) <= total


def test_grains_to_slots_refines_the_proportional_split() -> None:
    # the grains of 157 slots split over two pools by size alone hold fewer than 157; the refinement restores them
    case = DATA["grains_to_slots_refines_proportional_lower_bound"]["inputs"]
    gran, sizes, floor = case["granularity"], tuple(case["slot_size_list"]), case["min_slots"]
    grains = storage.grains_for_slots(floor, sizes, gran)
    slots, used = storage.grains_to_slots(grains, sizes, gran)
    assert slots >= floor and used <= grains
    assert storage.grains_for_slots(slots + 1, sizes, gran) > grains
