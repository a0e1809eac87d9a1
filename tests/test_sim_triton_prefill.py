"""Prefill attention on vLLM's Triton backend (sim/triton_prefill.py): which GPUs
and models vLLM 0.11.0's CUDA platform sends there, the kernel's FLOPs per byte
from its tile shapes, the A100's L2 bandwidth from a published measurement
(tests/data/gpu_l2_bandwidth/), and that only prefill attention of those models
on those GPUs changes -- all worked out by hand."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from kvpool.presets import load_gpu
from kvpool.sim.calibration import for_gpu
from kvpool.sim.kernels import Kernels
from kvpool.sim.steptime import StepTimeModel, load_weights
from kvpool.sim.triton_prefill import L2_BYTES_PER_S, block_m, picks_triton, triton_prefill
from kvpool.spec import load_model_spec

A100, H100 = load_gpu("a100"), load_gpu("h100")
OSS = load_model_spec("gpt-oss-20b")
L2_MEASURED = Path(__file__).parent / "data" / "gpu_l2_bandwidth" / "a100_80.json"


def test_vllm_sends_sink_models_to_triton_on_sm8x_only() -> None:
    # vllm/platforms/cuda.py (0.11.0): has_sink and capability >= 8.0 and != 9.0 -> TRITON_ATTN;
    # SM 10.0 returns FlashInfer first
    assert picks_triton(A100, OSS)  # SM 8.0
    assert picks_triton(load_gpu("l40s"), OSS)  # Ada, SM 8.9
    assert not picks_triton(H100, OSS)  # SM 9.0: FlashAttention 3 serves sinks
    assert not picks_triton(load_gpu("b200"), OSS)  # SM 10.0: FlashInfer
    assert not picks_triton(A100, load_model_spec("llama-3.1-8b-instruct"))  # no sinks: FlashAttention


@pytest.mark.parametrize(("queries_per_kv", "rows"), [(1, 16), (8, 16), (16, 16), (17, 32), (20, 32), (64, 64)])
def test_block_m_as_unified_attention_sets_it(queries_per_kv: int, rows: int) -> None:
    # BLOCK_M = 16 if num_queries_per_kv <= 16 else triton.next_power_of_2(num_queries_per_kv)
    assert block_m(queries_per_kv) == rows


def test_gpt_oss_on_a100_is_fed_16_flops_per_l2_byte() -> None:
    bound = triton_prefill(A100, OSS)
    assert bound is not None
    # 64 query heads over 8 KV heads: BLOCK_M 16 rows; one 32-key tile: QK^T and PV, 2 x 16 x 32 x 64 FLOPs
    # each, over its keys and values, 2 x 32 x 64 bf16 elements of 2 bytes
    per_tile_flops = 2 * (2 * 16 * 32 * 64)
    per_tile_bytes = 2 * 32 * 64 * 2
    assert bound.flops_per_byte == pytest.approx(per_tile_flops / per_tile_bytes) == 16.0
    assert bound.flops_per_s == pytest.approx(16 * L2_BYTES_PER_S["a100"])
    fp8 = triton_prefill(A100, dataclasses.replace(OSS, kv_dtype="fp8"))
    assert fp8 is not None and fp8.flops_per_byte == 32.0  # half the bytes per tile
    # TP 16: 4 query heads per rank over 1 replicated KV head -- still 16 rows
    tp16 = triton_prefill(A100, dataclasses.replace(OSS, tp_size=16))
    assert tp16 is not None and tp16.block_m == 16


def test_the_a100_l2_figure_is_the_measured_l2_resident_median() -> None:
    # gpu-benches' gpu-l2-cache on an A100 SXM4 80GB: rows whose shared data set fits one of the two L2
    # partitions (40 MB / 2; each caches the lines its own SMs read) are served by L2; their median
    data = json.loads(L2_MEASURED.read_text())
    assert "te42kyfo/gpu-benches" in data["source"]
    resident = [gbs for kb, gbs in data["rows"] if kb <= 40 * 1024 // 2]
    assert len(resident) > 20
    assert L2_BYTES_PER_S["a100"] == pytest.approx(statistics.median(resident) * 1e9, rel=1e-6)
    # past the L2 the same benchmark falls to the HBM's bandwidth (A100 80GB: 2,039 GB/s peak)
    beyond = [gbs for kb, gbs in data["rows"] if kb >= 60 * 1024]
    assert max(beyond) < A100.hbm_bandwidth_bytes_per_s / 1e9 < min(resident)
    # below the hardware's 5,120 bytes per clock at the 1,410 MHz boost clock (the whitepaper's figure)
    assert 0.7 < L2_BYTES_PER_S["a100"] / (5120 * 1.41e9) < 0.8


def test_no_bound_where_vllm_runs_another_kernel_or_l2_is_unknown() -> None:
    assert triton_prefill(H100, OSS) is None
    assert triton_prefill(load_gpu("l40s"), OSS) is None  # Triton too, but no published L2 figure here


def kernels(gpu_key: str, *, triton: bool) -> Kernels:
    gpu = load_gpu(gpu_key)
    return Kernels(
        for_gpu(gpu),
        gpu.hbm_bandwidth_bytes_per_s,
        gpu.bf16_flops,
        gpu.bf16_flops,
        triton=triton_prefill(gpu, OSS) if triton else None,
    )


def test_long_prefill_on_a100_runs_at_the_l2_roofline() -> None:
    # the L2 feeds 16 x 5,411 GB/s = 86.6 TFLOPs, below the calibrated share of the 312 TFLOPs peak
    k, plain = kernels("a100", triton=True), kernels("a100", triton=False)
    cal = k.cal
    l2 = 16 * L2_BYTES_PER_S["a100"]
    assert cal.prefill_attn_flops_eff * A100.bf16_flops > l2
    flops = 1e14
    assert k.prefill_attention(flops, 12) == pytest.approx(12 * cal.prefill_attn_floor_s + flops / l2)
    assert k.prefill_attention(flops, 12) > plain.prefill_attention(flops, 12)
    # decode attention reads each sequence's keys once per KV head on any backend: unchanged
    assert k.decode_attention(1e9, 1e9, 12) == plain.decode_attention(1e9, 1e9, 12)


def test_only_prefill_steps_of_sink_models_on_sm8x_cost_more() -> None:
    def model(gpu_key: str, *, triton: bool) -> StepTimeModel:
        m = StepTimeModel.build(OSS, load_gpu(gpu_key), load_weights("gpt-oss-20b"))
        assert m.kernels is not None
        return dataclasses.replace(
            m, kernels=dataclasses.replace(m.kernels, triton=m.kernels.triton if triton else None)
        )

    a100, a100_fa = model("a100", triton=True), model("a100", triton=False)
    assert a100.kernels is not None and a100.kernels.triton is not None
    chunk = [(30000, 2048)]  # a 2,048-token chunk late in a 32k prompt
    assert a100.cost([], chunk).attention > a100_fa.cost([], chunk).attention
    assert a100.cost([], chunk).matmul == a100_fa.cost([], chunk).matmul
    decode = [(30000, 0)] * 64
    assert a100.time(decode, []) == a100_fa.time(decode, [])
    h100 = model("h100", triton=True)
    assert h100.kernels is not None and h100.kernels.triton is None
