"""TensorRT-LLM KV cache manager V2 by its own defaults (`kvpool.engines.trtllm_v2`).

Expectations come from TensorRT-LLM's core package and its tests, as listed with
their sources in tests/data/trtllm/README.md, and are derived here by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cli.main import main
from kvpool.engines import trtllm, trtllm_v2
from kvpool.engines import trtllm_v2_storage as storage
from kvpool.errors import LimitsError
from kvpool.plan import ServingLimits
from kvpool.spec import LayerGroup, ModelSpec, load_model_spec
from kvpool.spec.drafts import load_draft
from kvpool.spec.groups import Drafter
from plan_helpers import group, hybrid, model

MiB, GiB = 1 << 20, 1 << 30
CONFIGS = Path(__file__).parent / "data" / "configs"


@pytest.mark.parametrize(
    "quota,expected",
    [
        (1 * GiB, 2 * MiB),
        (2 * GiB - 1, 2 * MiB),
        (2 * GiB, 4 * MiB),
        (5 * GiB, 8 * MiB),
        (15 * GiB, 16 * MiB),
        (16 * GiB, 32 * MiB),
        (60 * GiB, 32 * MiB),
        (1024 * GiB, 32 * MiB),
    ],
)
def test_granularity_doubles_from_2_mib_to_32_mib(quota: int, expected: int) -> None:
    # _storage/_config.py: 2 MiB << min(4, max(0, floor(log2(quota / 1 GiB))))
    assert trtllm_v2.granularity(quota) == expected


def test_fallback_request_blocks_at_tpb_32() -> None:
    # _storage_manager.py allocator fallback: full needs 65 blocks, W=1024 sliding 65 - floor(1025/32) = 33
    spec = hybrid(window=1024, tpb=32)
    blocks = {g.name: trtllm_v2.life_cycle_blocks(g, 2049, 2048, 32) for g in spec.groups}
    assert blocks == {"full": 65, "sliding": 33}


def test_pool_groups_merge_equal_slot_sizes() -> None:
    # test_storage_manager.py: equal-size sliding + full share one pool group; different sizes give two
    same = trtllm_v2.size(hybrid(full_row=1024, sliding_row=1024), 4 * GiB)
    assert [names for names, *_ in same.pool_groups] == [("full", "sliding")]
    differ = trtllm_v2.size(hybrid(full_row=1024, sliding_row=2048), 4 * GiB)
    assert sorted(names for names, *_ in differ.pool_groups) == [("full",), ("sliding",)]
    uniform = trtllm_v2.size(model(group("full", row_bytes=4096)), GiB)
    assert len(uniform.pool_groups) == 1 and uniform.pool_groups[0][4] == GiB // (4096 * 32)


def test_gemma_4_fp8_60_gib_gives_v2_slots() -> None:
    # TensorRT-LLM V2 gives sliding 15,728 / full 39,321. By hand: 60 GiB / 32 MiB = 1920 grains; the fallback
    # request holds 33 x 3,276,800 B (-> 4 grains) and 65 x 327,680 B (-> 1 grain): ratio 4 : 1, so
    # 1536 and 384 grains; 1536 x 32 MiB // 3,276,800 = 15,728 and 384 x 32 MiB // 327,680 = 39,321.
    spec = load_model_spec("gemma-4-26b-a4b", kv_dtype="fp8")
    report = trtllm.allocate(spec, ServingLimits(max_seq_len=32768), 60 * GiB, manager="v2-default")
    assert report.group_pages == {"sliding": 15_728, "full": 39_321}
    assert report.reported["grains"] == 1920 and report.reported["granularity"] == 32 * MiB
    assert sum(p.bytes for p in report.pools) <= 60 * GiB


@settings(max_examples=60, deadline=None)
@given(
    full_row=st.integers(1, 64).map(lambda k: k * 512),
    sliding_row=st.integers(1, 64).map(lambda k: k * 512),
    window=st.sampled_from([128, 512, 1024, 4096]),
    quota=st.integers(1 * GiB, 200 * GiB),
)
def test_water_filling_spends_at_most_the_rounded_quota(
    full_row: int, sliding_row: int, window: int, quota: int
) -> None:
    sizing = trtllm_v2.size(hybrid(full_row=full_row, sliding_row=sliding_row, window=window), quota)
    assert not sizing.inflated
    assert sum(g for *_, g, _ in sizing.pool_groups) <= sizing.grains == -(-quota // sizing.granularity)
    for _, slot, floor, grains, slots in sizing.pool_groups:
        assert slots == grains * sizing.granularity // slot >= floor
    assert 0 <= sizing.leftover_bytes < sum(slot for _, slot, *_ in sizing.pool_groups)


def test_sliding_floor_pins_and_inflates_when_it_does_not_fit() -> None:
    # newest StorageManager floor for a sliding life cycle: (W + tpb - 2) // tpb + 1 = 33 at W 1024, tpb 32;
    # a 2 MiB sliding slot needs 33 grains of 2 MiB, more than a 64 MiB quota's 32: V2 grows the quota
    assert trtllm_v2.sliding_floor(1024, 32) == 33 and trtllm_v2.sliding_floor(1, 32) == 1
    spec = hybrid(full_row=1024, sliding_row=65536, window=1024)
    sizing = trtllm_v2.size(spec, 64 * MiB)
    slots = {names: n for names, _, _, _, n in sizing.pool_groups}
    assert sizing.inflated and slots[("sliding",)] == 33
    report = trtllm.allocate(spec, ServingLimits(max_seq_len=8192), 64 * MiB, manager="v2-default")
    assert any("grows the quota" in d for d in report.degradations)


def test_cli_engine_trtllm_is_v2_and_trtllm_at_v1_the_old_manager(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "gemma-4-26b-a4b", "--kv-dtype", "fp8", "--kv-memory", "60GiB", "--max-seq-len", "32768"]
    assert main([*argv, "--engine", "trtllm"]) == 0
    out = capsys.readouterr().out
    assert "prints: [sliding] 15728 slots of 3276800 bytes" in out and "KV cache manager V2" in out
    assert "16,425" in out  # kvpool's own plan stays beside it
    assert main([*argv, "--engine", "trtllm@v1"]) == 0
    v1 = capsys.readouterr().out
    assert "[windowSize=1024] {.primaryBlocks=" in v1
    assert main([*argv, "--engine", "trtllm-v1"]) == 0  # the alias names the same model
    assert capsys.readouterr().out == v1


def test_engine_alias_trtllm_v1_resolves_and_unknown_names_still_fail() -> None:
    from kvpool.engines.common import EngineNotModelledError, split_engine_name

    releases = {"trtllm": ("v2", "v1")}
    assert split_engine_name("trtllm-v1", releases) == ("trtllm", "v1")
    assert split_engine_name("trtllm", releases) == ("trtllm", "v2")
    with pytest.raises(EngineNotModelledError):
        split_engine_name("trtllm-v3", releases)


# NVIDIA/TensorRT-LLM tests/unittest/kv_cache_manager_v2_tests/test_storage_manager.py at commit
# ed3fb4f5496400a215c92028b3e53a44627b7fc6: K and V buffers of 8192 bytes per block and layer at tpb 32,
# a 256 MiB GPU quota ("small enough ... that phys_mem_size stays at 2 MiB").
KV_BUF = 8192


def _row(layers: int, buf: int = KV_BUF) -> int:
    return layers * 2 * buf // 32  # bytes per token: layers x (K + V) x buffer bytes per 32-token block


def test_storage_manager_single_life_cycle_gpu_only() -> None:
    sizing = trtllm_v2.size(model(group("full", row_bytes=_row(4))), 256 * MiB)
    assert sizing.granularity == 2 * MiB
    assert [(len(names), slot) for names, slot, *_ in sizing.pool_groups] == [(1, 4 * 2 * KV_BUF)]


def test_storage_manager_two_life_cycles_same_slot_size_merged() -> None:
    spec = model(group("full", row_bytes=_row(2)), group("sliding", kind="sliding", row_bytes=_row(2), window=100))
    sizing = trtllm_v2.size(spec, 256 * MiB)
    assert [(len(names), slot) for names, slot, *_ in sizing.pool_groups] == [(2, 2 * 2 * KV_BUF)]


def test_storage_manager_two_life_cycles_different_slot_sizes_separate_pool_groups() -> None:
    spec = model(
        group("full", row_bytes=_row(1)), group("sliding", kind="sliding", row_bytes=_row(1, 16384), window=100)
    )
    sizing = trtllm_v2.size(spec, 256 * MiB)
    assert sorted(slot for _, slot, *_ in sizing.pool_groups) == [8192 * 2, 16384 * 2]


def test_state_models_say_the_mamba_manager_typical_step_is_not_modelled() -> None:
    spec = model(group("full", row_bytes=1024), group("ssm", "state", state_bytes=1 << 20))
    report = trtllm.allocate(spec, ServingLimits(max_seq_len=8192), GiB, manager="v2-default")
    assert any("hybrid Mamba manager" in n for n in report.notes)
    plain = trtllm.allocate(hybrid(), ServingLimits(max_seq_len=8192), GiB, manager="v2-default")
    assert not any("hybrid Mamba manager" in n for n in plain.notes)


def test_max_tokens_quota_holds_the_state_slots() -> None:
    """The hybrid Mamba manager's `_get_quota_from_max_tokens` adds its state slots to the
    attention quota: one per resident request (B) and one per padding dummy, each of
    the model's state bytes; without them a max_tokens cap leaves no room for the state."""
    from kvpool import load_model_spec
    from kvpool.engines.trtllm_v2 import V2Options, quota_from_max_tokens

    spec = load_model_spec("qwen3-next-80b-a3b")
    state = sum(g.state_bytes for g in spec.groups if g.kind == "state")
    full = sum(g.row_bytes for g in spec.groups if g.kind == "full")
    assert state > 0
    o = V2Options(max_tokens=10_000, max_num_tokens=8192, max_batch_size=16)
    assert quota_from_max_tokens(spec, o) == 10_000 * full + (16 + 1) * state


def test_nvfp4_scales_are_a_pool_of_their_own() -> None:
    # Qwen3-8B, NVFP4 KV, 16 GiB: per layer K = V = 8 heads x 128 = 1024 values -> 512 B of data and 64 B of FP8
    # scales per token; at 32 tokens per block the 36 layers' K and V give pools of 36 x 2 x 16,384 = 1,179,648 B
    # and 36 x 2 x 2,048 = 147,456 B. 512 grains of 32 MiB: the scale pool (smaller, first) gets
    # round(512 x 147,456 / 1,327,104) = 57 grains -> 12,970 slots, the data pool the other 455 -> 12,942 slots;
    # 12,943 slots would take 456 + 57 = 513 grains. One pool of 1,327,104 B would give 12,945 (kvpool before).
    spec = load_model_spec("qwen3-8b", kv_dtype="nvfp4")
    sizing = trtllm_v2.size(spec, 16 * GiB)
    assert sizing.pools == ((1_179_648, 147_456),)
    assert [(names, slots) for names, *_, slots in sizing.pool_groups] == [(("full",), 12_942)]


def test_two_groups_of_one_window_are_one_pool_group_of_two_pools() -> None:
    # Two full-attention groups whose layers differ in size are one V2 life cycle: pools 2 x 1536 x 32 = 98,304 B
    # and 4 x 512 x 32 = 65,536 B, one slot count for both. 1 GiB = 512 grains of 2 MiB: the smaller pool gets
    # round(512 x 0.4) = 205 grains -> 6,560 slots, the larger 307 -> 6,549; 6,550 would take 308 + 205 grains.
    # (As two pool groups of a 4 : 3 fallback ratio they got 6,250 and 7,008 slots: unequal, unusable together.)
    small = LayerGroup("full_a", "full", (0, 1, 2, 3), 32, row_bytes=4 * 512)
    large = LayerGroup("full_b", "full", (4, 5), 32, row_bytes=2 * 1536)
    sizing = trtllm_v2.size(model(small, large), GiB)
    assert sizing.pools == ((98_304, 65_536),)
    assert [(names, slots) for names, *_, slots in sizing.pool_groups] == [(("full_a", "full_b"), 6549)]


def test_two_ssm_buffers_are_rounded_to_grains_each() -> None:
    # A state layer of conv 0.75 MiB and SSM 3.25 MiB: two pools, each its own whole grains. 16 MiB = 8 grains of
    # 2 MiB: 4 slots would take ceil(3 MiB / 2 MiB) + ceil(13 MiB / 2 MiB) = 2 + 7 = 9 grains, 3 slots take
    # 2 + 5 = 7; one 4 MiB pool would hold 4.
    conv, ssm = 3 * MiB // 4, 13 * MiB // 4
    state = LayerGroup("mamba", "state", (0,), 32, state_bytes=conv + ssm, buffers=(conv, ssm))
    sizing = trtllm_v2.size(model(state), 16 * MiB)
    assert sizing.pools == ((ssm, conv),)
    assert [slots for *_, slots in sizing.pool_groups] == [3]


def test_mamba_state_is_conv_and_ssm_buffers() -> None:
    # Nemotron-H-56B (its published config): conv (256 x 64 + 2 x 8 x 256) x (4 - 1) bf16 = 122,880 B and SSM
    # 256 x 64 x 256 float32 = 16,777,216 B per layer; 54 Mamba layers -> pools 905,969,664 and 6,635,520 B
    spec = load_model_spec(str(CONFIGS / "Nemotron-H-56B-Base-8K.json"))
    state = next(g for g in spec.groups if g.kind == "state")
    assert state.buffers == (122_880, 16_777_216) and len(state.layers) == 54
    assert trtllm_v2.size(spec, 8 * GiB).pools[0] == (54 * 16_777_216, 54 * 122_880)


def test_merged_ratio_is_float32_as_v2_sums_it() -> None:
    # full + W=1024 sliding of one slot size (one pool group) and a W=256 sliding group, tpb 64, 54,023,500,657 B:
    # 1,611 grains of 32 MiB. The fallback request holds 3, 2 and 1 grains: V2 takes float32 3/6 and 2/6, sums them
    # in float32 and normalises again; the W=256 group's share of the budget is then 268.5 grains less a float32
    # hair, which rounds to 268 (5,717 slots) and leaves 1,343 to the merged group (21,488); one float32 of 5/6
    # made it 268.5 plus a hair -> 269 grains (5,738 / 21,472).
    full = LayerGroup("full", "full", tuple(range(8)), 64, row_bytes=8 * 4096)
    sliding = LayerGroup("sliding", "sliding", tuple(range(8, 16)), 64, row_bytes=8 * 4096, window=1024)
    local = LayerGroup("local", "sliding", tuple(range(16, 22)), 64, row_bytes=6 * 4096, window=256)
    lc = [np.float32(np.float32(n) / np.float32(6)) for n in (3, 2, 1)]
    merged, alone = np.float32(lc[0] + lc[1]), lc[2]
    total = np.float32(merged + alone)
    share = float(np.float32(alone / total)) / (float(np.float32(alone / total)) + float(np.float32(merged / total)))
    one_float = float(np.float32(1 / 6)) / (float(np.float32(1 / 6)) + float(np.float32(5 / 6)))
    assert round(1611 * share) == 268 and round(1611 * one_float) == 269
    sizing = trtllm_v2.size(model(full, sliding, local), 54_023_500_657)
    slots = {names: n for names, _, _, _, n in sizing.pool_groups}
    assert slots == {("full", "sliding"): 1343 * 32 * MiB // (64 * 32768), ("local",): 268 * 32 * MiB // (64 * 24576)}


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.lists(st.integers(1, 64 * MiB), min_size=1, max_size=3), min_size=1, max_size=3),
    floors=st.lists(st.integers(1, 50), min_size=3, max_size=3),
    extra=st.integers(0, 2000),
    ratios=st.lists(st.floats(0.01, 1.0), min_size=3, max_size=3),
)
def test_water_filling_of_pools_holds_floors_within_the_grains(
    sizes: list[list[int]], floors: list[int], extra: int, ratios: list[float]
) -> None:
    gran = 2 * MiB
    pools = [tuple(sorted(s, reverse=True)) for s in sizes]
    n = len(pools)
    need = sum(storage.grains_for_slots(f, s, gran) for f, s in zip(floors, pools, strict=False))
    total = need + extra
    slots = storage.water_fill(total, gran, pools, [np.float32(r) for r in ratios[:n]], floors[:n])
    spent = [storage.grains_for_slots(k, s, gran) for k, s in zip(slots, pools, strict=True)]
    assert sum(spent) <= total
    assert all(k >= f for k, f in zip(slots, floors, strict=False))
    for k, s in zip(slots, pools, strict=True):  # no group could take one more slot in its own grains
        got, used = storage.grains_to_slots(storage.grains_for_slots(k, s, gran), s, gran)
        assert got == k and used == storage.grains_for_slots(k, s, gran)


def _with_drafter(*groups: LayerGroup) -> ModelSpec:
    return ModelSpec("toy", "attention", groups, 32, "bf16", 1, len(groups), 131072, drafter=Drafter("eagle", "d", 1))


def test_a_drafter_gets_its_own_manager_and_share_of_the_budget() -> None:
    # KvCacheCreator._compute_draft_budget_shares: each manager keeps its fixed bytes (the target's W=1024 sliding
    # layer: B x 1024 x 1024 B = 8 MiB at B = 8), the rest is split by bytes per token (full rows 1024 : 512):
    # drafter int((1 GiB - 8 MiB) x 512 / 1536) = 355,117,738 B, target 718,624,086 B. Each is sized on its own:
    # target ceil(718,624,086 / 2 MiB) = 343 grains of 32 KiB slots -> 21,952; drafter 170 grains of 16 KiB -> 21,760
    spec = _with_drafter(
        LayerGroup("full", "full", (0,), 32, row_bytes=1024),
        LayerGroup("sliding", "sliding", (1,), 32, row_bytes=1024, window=1024),
        LayerGroup("draft.full", "full", (2,), 32, row_bytes=512, draft=True),
    )
    report = trtllm.allocate(spec, ServingLimits(max_batch_size=8, max_seq_len=8192), GiB, manager="v2-default")
    assert (report.reported["target_budget_bytes"], report.reported["draft_budget_bytes"]) == (718_624_086, 355_117_738)
    assert report.reported["slots_per_pool_group"] == {"full+sliding": 21_952, "draft.full": 21_760}
    assert any("more than the" in d for d in report.degradations)  # each manager rounds its quota up


def test_a_drafter_of_a_real_pair_splits_by_bytes_per_token() -> None:
    # Qwen3-8B (36 layers x 8 KV heads x 128 x 2 x 2 B = 147,456 B per token) and Qwen3-0.6B (28 layers: 114,688 B)
    # at 8 GiB: the drafter gets 8 GiB x 114,688 / 262,144 = 3.5 GiB (4 MiB grains: 896 -> 896 x 4 MiB / 3,670,016 =
    # 1,024 slots), the target 4.5 GiB (8 MiB grains: 576 -> 576 x 8 MiB / 4,718,592 = 1,024)
    spec = load_draft(load_model_spec("qwen3-8b"), "qwen3-0.6b")
    report = trtllm.allocate(spec, ServingLimits(max_seq_len=8192), 8 * GiB, manager="v2-default")
    assert report.reported["draft_budget_bytes"] == 7 * GiB // 2
    assert report.group_pages == {"full": 1024, "draft.full": 1024}


def test_budget_split_rules() -> None:
    assert trtllm_v2.split_draft_budget(100, (3, 0), (1, 0)) == (75, 25)
    assert trtllm_v2.split_draft_budget(100, (3, 10), (1, 6)) == (100 - 6 - 21, 6 + 21)  # int(84 x 1 / 4) = 21
    assert trtllm_v2.split_draft_budget(100, (0, 10), (1, 6)) == (100, 100)  # no full-attention bytes: no split
    with pytest.raises(LimitsError, match="fixed bytes"):
        trtllm_v2.split_draft_budget(100, (3, 60), (1, 40))


def test_a_drafter_with_two_windows_is_refused_as_v2_refuses_it() -> None:
    spec = _with_drafter(
        LayerGroup("full", "full", (0,), 32, row_bytes=1024),
        LayerGroup("draft.full", "full", (1,), 32, row_bytes=512, draft=True),
        LayerGroup("draft.sliding", "sliding", (2,), 32, row_bytes=512, window=512, draft=True),
    )
    report = trtllm.allocate(spec, ServingLimits(max_seq_len=8192), GiB, manager="v2-default")
    assert report.refusals and "VSWA draft" in report.refusals[0]
