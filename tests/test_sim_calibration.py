"""The calibrated step-time model: its costs by hand, its fits on synthetic
data they must recover, its fit on Vidur's measured kernels (held-out models
included) and the shipped constants rebuilt from that data."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvpool.presets import DATA, load_gpu
from kvpool.sim.calibration import (
    StepSample,
    fit_affine,
    fit_matmul,
    fit_steps,
    for_gpu,
    load_profile,
    profile_json,
    shipped,
)
from kvpool.sim.kernels import Calibration, CalibrationError
from kvpool.sim.matmuls import Gemm, model_shapes
from kvpool.sim.steptime import StepTimeModel, Weights
from kvpool.spec import load_model_spec
from sim_helpers import toy_gpu

ROOT = Path(__file__).resolve().parent.parent
GPU = toy_gpu(fp8_flops=2e14)

# round constants so every cost below can be written out by hand
CAL = Calibration(
    name="round",
    linear_flops_eff=0.5,
    linear_bw_eff=0.8,
    linear_blend=1.0,
    linear_floor_s=5e-6,
    elementwise_bytes=40.0,
    elementwise_floor_s=10e-6,
    decode_attn_bw_eff=0.5,
    decode_attn_floor_s=20e-6,
    prefill_attn_flops_eff=0.25,
    prefill_attn_floor_s=15e-6,
    allreduce_latency_s=5e-6,
    allreduce_small_bytes_per_s=40e9,
    allreduce_bus_bytes_per_s=400e9,
    moe_floor_s=20e-6,
    moe_tile=16,
    step_floor_s=1e-3,
    row_s=10e-6,
    launch_s=10e-6,
)

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def llama(tp: int = 1, **extra: Any) -> StepTimeModel:
    spec = load_model_spec({**LLAMA, **extra}, tokens_per_block=4, tp_size=tp)
    return StepTimeModel.build(spec, GPU, Weights(1e6, 1e6, 2.0), CAL)


def mm(tokens: float, k: int, n: int, count: int = 1) -> float:
    """One matmul at the round constants (blend 1: the two times add)."""
    flops = 2 * tokens * k * n / (0.5 * 1e14)
    moved = (k * n * 2 + 2 * tokens * (k + n)) / (0.8 * 1e12)
    return count * (5e-6 + flops + moved)


def test_llama_shapes_per_rank() -> None:
    s = llama().shapes
    # q, o: 64 x 64; k, v: 64 -> 32; gate, up: 64 -> 128; down: 128 -> 64; two layers each
    assert sorted((g.k, g.n, g.count) for g in s.dense) == [
        (64, 32, 4),
        (64, 64, 4),
        (64, 128, 4),
        (128, 64, 2),
    ]
    assert s.lm_head == Gemm(64, 100)
    # column-parallel outputs and row-parallel inputs halve: q 64 -> 32, k and v 32 -> 16,
    # o 32 x 64, gate and up 64 -> 64, down 64 x 64
    s2 = llama(tp=2).shapes
    assert sorted((g.k, g.n, g.count) for g in s2.dense) == [(32, 64, 2), (64, 16, 4), (64, 32, 2), (64, 64, 6)]
    assert s2.lm_head == Gemm(64, 50)


def test_decode_step_by_hand() -> None:
    model = llama()
    # two decode rows at history 10 and 20 in a CUDA graph padded to 2
    c = model.cost([(10, 0), (20, 0)], [], graph=True, padded_batch=2)
    matmul = mm(2, 64, 32, 4) + mm(2, 64, 64, 4) + mm(2, 64, 128, 4) + mm(2, 128, 64, 2) + mm(2, 64, 100)
    assert c.matmul == pytest.approx(matmul, rel=1e-12)
    # KV: 2 layers x 2 KV heads x 16 x K,V x 2 bytes = 256 bytes per position; 11 + 21 keys read,
    # 2 rows written; FLOPs 4 x 4 heads x 16 x 2 layers = 512 per pair (bandwidth bound here)
    kv = 256 * (11 + 21 + 2)
    assert c.attention == pytest.approx(2 * 20e-6 + kv / (0.5 * 1e12), rel=1e-12)
    assert c.elementwise == pytest.approx(2 * (10e-6 + 40 * 2 * 64 / 1e12), rel=1e-12)
    assert c.allreduce == 0 and c.experts == 0
    assert c.overhead == pytest.approx(1e-3 + 2 * 10e-6, rel=1e-12)
    assert c.total == pytest.approx(matmul + c.attention + c.elementwise + c.overhead, rel=1e-12)


def test_eager_step_is_bound_by_launches_when_the_gpu_is_faster() -> None:
    model = llama()
    c = model.cost([(10, 0)], [])
    gpu = c.matmul + c.attention + c.elementwise
    launches = 10e-6 * (2 * 10 + 6)  # 2 layers x 10 kernels + 6 per step
    assert launches > gpu
    assert c.total == pytest.approx(launches + 1e-3 + 10e-6, rel=1e-12)


def test_prefill_attention_by_hand_and_tp_all_reduce() -> None:
    model = llama(tp=2)
    c = model.cost([], [(0, 100)])
    # 4 heads / 2 ranks x 16 dims x 4 x 2 layers = 256 FLOPs per pair; 100 x 101 / 2 pairs
    assert c.attention == pytest.approx(2 * 15e-6 + 256 * 5050 / (0.25 * 1e14), rel=1e-12)
    # 4 all-reduces (2 per layer) of 100 x 64 x 2 bytes, each by the faster algorithm
    size = 100 * 64 * 2
    one_shot = 5e-6 + size / 40e9
    ring = 5e-6 + 2 * (2 - 1) / 2 * size / 400e9
    assert c.allreduce == pytest.approx(4 * min(one_shot, ring), rel=1e-12)


def test_experts_pay_whole_tiles_of_the_tokens_they_get() -> None:
    cfg = {
        **LLAMA,
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    spec = load_model_spec(cfg, tokens_per_block=4)
    model = StepTimeModel.build(spec, GPU, Weights(1e6, 1e6, 2.0), CAL)
    sh = model.shapes
    assert (sh.experts, sh.top_k, sh.moe_layers) == (8, 2, 2)
    assert sorted((g.k, g.n, g.count) for g in sh.expert) == [(64, 128, 2), (128, 64, 1)]
    # one token touches its 2 experts, each gets 1 row: a whole 16-row tile of math
    assert sh.touched_experts(1) == pytest.approx(2)
    c = model.cost([(10, 0)], [], graph=True, padded_batch=1)

    def expert(k: int, n: int, count: int) -> float:
        flops = 2 * 2 * 16 * k * n / (0.5 * 1e14)
        moved = (2 * k * n * 2 + 2 * 1 * 2 * (k + n)) / (0.8 * 1e12)
        return count * (5e-6 + flops + moved)

    per_layer = 20e-6 + expert(64, 128, 2) + expert(128, 64, 1)
    assert c.experts == pytest.approx(2 * per_layer, rel=1e-12)
    # with many tokens every expert is touched
    assert sh.touched_experts(10_000) == pytest.approx(8)


def test_w4a16_weights_run_bf16_math_and_fp8_weights_the_fp8_peak() -> None:
    spec = load_model_spec(LLAMA, tokens_per_block=4)
    fp8 = StepTimeModel.build(spec, GPU, Weights(1e6, 1e6, 1.0), CAL)
    mxfp4 = StepTimeModel.build(spec, GPU, Weights(1e6, 1e6, 0.53), CAL)
    assert fp8.kernels is not None and fp8.kernels.matmul_flops == 2e14
    assert mxfp4.kernels is not None and mxfp4.kernels.matmul_flops == 1e14


# ------------------------------------------------------------------ fits recover what made the data


def test_fit_matmul_recovers_the_constants_of_synthetic_timings() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 8192, 400).astype(float)
    k = rng.choice([1024.0, 4096.0, 8192.0], 400)
    n = rng.choice([512.0, 2048.0, 14336.0], 400)
    flops, hbm = 1e15, 3e12
    f = 2 * tokens * k * n / flops
    b = (k * n * 2 + 2 * tokens * (k + n)) / hbm
    t = 6e-6 + ((f / 0.62) ** 1.5 + (b / 0.85) ** 1.5) ** (1 / 1.5)
    fit = fit_matmul(tokens, k, n, t, flops=flops, hbm=hbm)
    assert fit.values["linear_flops_eff"] == pytest.approx(0.62, abs=0.011)
    assert fit.values["linear_bw_eff"] == pytest.approx(0.85, abs=0.011)
    assert fit.values["linear_blend"] == 1.5
    assert fit.values["linear_floor_s"] == pytest.approx(6e-6, rel=0.2)
    assert fit.median_error < 0.01


def test_fit_affine_and_steps_recover_their_constants() -> None:
    x = np.linspace(1e-5, 1e-2, 50)
    floor, slope, fit = fit_affine(x, 2e-5 + x / 0.7)
    assert (floor, 1 / slope) == pytest.approx((2e-5, 0.7))
    assert fit.median_error < 1e-9
    base = shipped()["h100"]
    rng = np.random.default_rng(1)
    gpu = rng.uniform(2e-3, 0.2, 20)
    req = rng.integers(1, 256, 20)
    samples = [StepSample(g, int(r), g / 0.8 + 1.5e-3 + 12e-6 * r) for g, r in zip(gpu, req, strict=True)]
    cal, fit = fit_steps(base, samples)
    assert fit.values["efficiency_scale"] == pytest.approx(0.8)
    assert (cal.step_floor_s, cal.row_s) == pytest.approx((1.5e-3, 12e-6))
    assert cal.linear_bw_eff == pytest.approx(base.linear_bw_eff * 0.8)
    with pytest.raises(CalibrationError, match="at least 3"):
        fit_steps(base, samples[:2])
    with pytest.raises(CalibrationError, match="> 0"):
        fit_affine(x, -x)


# ------------------------------------------------------------------ Vidur's measured kernels


def _fit_script() -> Any:
    spec = importlib.util.spec_from_file_location("fit_calibration", ROOT / "benchmarks" / "fit_calibration.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_shipped_constants_are_rebuilt_from_vidurs_measurements() -> None:
    profiles, report = _fit_script().build()
    body = json.loads((DATA / "calibration.json").read_text())
    for gpu, prof in profiles.items():
        for key, value in prof.items():
            if isinstance(value, float):
                assert body["profiles"][gpu][key] == pytest.approx(value, rel=1e-9), (gpu, key)
    # the fit predicts matmuls of a model it did not see (Vidur measured, nobody here tuned)
    for gpu in ("a100", "h100"):
        held = next(v for k, v in report.items() if k.startswith(f"{gpu}_held_out"))
        assert held["median_error"] < 0.10 and held["p90_error"] < 0.25, (gpu, held)
    assert report["attention"]["decode"]["median_error"] < 0.10
    assert report["attention"]["prefill"]["median_error"] < 0.15
    # the fitted shares of peak are physical, and in the ranges published measurements give
    for prof in profiles.values():
        assert 0.55 <= prof["linear_flops_eff"] <= 0.85 and 0.7 <= prof["linear_bw_eff"] <= 1.0
        assert 0.6 <= prof["decode_attn_bw_eff"] <= 0.9 and 0.35 <= prof["prefill_attn_flops_eff"] <= 0.6


def test_the_vidur_copy_keeps_its_licence() -> None:
    assert "MIT" in (ROOT / "tests" / "data" / "vidur" / "LICENSE").read_text()
    assert "MIT" in (DATA / "VIDUR-LICENSE").read_text()


# ------------------------------------------------------------------ profiles


def test_gpus_without_a_profile_borrow_the_nearest() -> None:
    assert for_gpu(load_gpu("h100")).name == "h100"
    assert for_gpu(load_gpu("h200")).name == "h100 (for h200)"
    a10 = for_gpu(load_gpu("a10"))
    assert a10.name.startswith("a100 (for") and a10.linear_bw_eff == shipped()["a100"].linear_bw_eff


def test_profiles_round_trip_and_bad_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    cal = dataclasses.replace(shipped()["h100"], name="mine")
    path.write_text(profile_json(cal, report={"samples": 3}))
    assert load_profile(path) == dataclasses.replace(cal)
    body = json.loads(path.read_text())
    body["calibration"]["linear_bw_eff"] = -1
    path.write_text(json.dumps(body))
    with pytest.raises(CalibrationError, match="linear_bw_eff"):
        load_profile(path)
    del body["calibration"]["row_s"]
    path.write_text(json.dumps(body))
    with pytest.raises(CalibrationError, match="lacks row_s"):
        load_profile(path)
    path.write_text("not json")
    with pytest.raises(CalibrationError, match="not JSON"):
        load_profile(path)
    with pytest.raises(CalibrationError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    body["calibration"].update(row_s=math.nan, linear_bw_eff=cal.linear_bw_eff)
    path.write_text(json.dumps(body))  # json writes NaN, which load_profile must refuse
    with pytest.raises(CalibrationError, match="row_s"):
        load_profile(path)


def test_unknown_family_falls_back_to_attention_fields_and_parameter_counts() -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "num_attention_heads": 4, "head_dim": 16}
    s = model_shapes(cfg, 1, total_params=1e6, active_params=1e6)
    # q and o 64 x 64 and k, v 64 x 64 (no num_key_value_heads: as many as query heads) per
    # layer; the rest of 1e6 less embeddings and lm_head (2 x 6400) and attention
    # (2 layers x 4 x 4096) as gate, up and down of (rest / 2 layers / 3 / 64) outputs
    attention = 2 * 4 * 64 * 64
    rest = (1e6 - 2 * 6400 - attention) / 2
    assert s.dense == (Gemm(64, 64, 2), Gemm(64, 64, 4), Gemm(64, 64, 2), Gemm(64, int(rest / 3 / 64), 6))
    moe = model_shapes(cfg, 1, total_params=9e6, active_params=1e6, experts=8, top_k=1)
    # each expert: (9e6 - 1e6) / (8 - 1) / 2 layers, as three multiplies of 64 inputs
    per_expert = 8e6 / 7 / 2
    assert moe.expert == (Gemm(64, int(per_expert / 3 / 64), 3),)
    assert (moe.experts, moe.top_k, moe.moe_layers) == (8, 1, 2)


def test_a_profile_is_never_written_with_infinity_or_nan() -> None:
    """A fit whose report holds NaN (or a constant past the GPU's peak) is
    refused, not written as a profile `--calibration` would price steps with."""
    with pytest.raises(CalibrationError, match="non-finite"):
        profile_json(shipped()["h100"], report={"median_error": math.nan})
    with pytest.raises(CalibrationError, match="above 1"):
        dataclasses.replace(shipped()["h100"], linear_bw_eff=1.7)
