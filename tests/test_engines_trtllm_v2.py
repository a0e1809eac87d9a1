"""TensorRT-LLM KV cache manager V2 by its own defaults (`kvpool.engines.trtllm_v2`).

Expectations come from TensorRT-LLM's core package and its tests, as listed with
their sources in tests/data/trtllm/README.md, and are derived here by hand.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cli.main import main
from kvpool.engines import trtllm, trtllm_v2
from kvpool.plan import ServingLimits
from kvpool.spec import load_model_spec
from plan_helpers import group, hybrid, model

MiB, GiB = 1 << 20, 1 << 30


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
    # issue 26: V2 gives sliding 15,728 / full 39,321. By hand: 60 GiB / 32 MiB = 1920 grains; the fallback
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
