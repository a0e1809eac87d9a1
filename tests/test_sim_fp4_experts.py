"""MXFP4 experts on GPUs without FP4 tensor cores (sim/fp4_experts.py): the
kernel vLLM runs them with, its blocks and its MMA rate, derived by hand; the
checkpoint's storage (experts 4 bits + an E8M0 scale per 32, the rest bf16);
the blocks each expert's binomial share of the rows pads to; and nothing changes
for weights that are not 4-bit or GPUs with their own kernels."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.presets import load_gpu
from kvpool.sim.calibration import for_gpu
from kvpool.sim.fp4_experts import HOPPER_MMA_SYNC_SHARE, expected_blocks, fp4_experts
from kvpool.sim.kernels import Kernels
from kvpool.sim.matmuls import Gemm
from kvpool.sim.steptime import StepTimeModel, expert_storage, load_weights
from kvpool.spec import load_model_spec

H100, A100, B200 = load_gpu("h100"), load_gpu("a100"), load_gpu("b200")


def kernels(gpu_key: str, *, fp4: bool = True) -> Kernels:
    gpu = load_gpu(gpu_key)
    cal = for_gpu(gpu)
    return Kernels(
        cal, gpu.hbm_bandwidth_bytes_per_s, gpu.bf16_flops, gpu.bf16_flops, fp4_experts(gpu) if fp4 else None
    )


def test_the_kernel_per_architecture() -> None:
    hopper, ampere = fp4_experts(H100), fp4_experts(A100)
    assert hopper is not None and ampere is not None
    assert hopper.kernel == ampere.kernel == "marlin"
    assert hopper.mma_share == pytest.approx(2 / 3) and ampere.mma_share == 1.0
    assert fp4_experts(load_gpu("l40s")) is not None  # Ada: Marlin too (no triton_kernels below SM90)
    assert fp4_experts(B200) is None  # FP4 tensor cores: not this kernel
    assert fp4_experts(load_gpu("mi300x")) is None


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "block"),
    [
        # tokens x top_k / experts per expert; the first block with per_expert / block < 0.9, else 64
        (1, 4, 32, 8),  # 0.125 / 8
        (64, 4, 32, 16),  # 8 / 8 = 1.0 >= 0.9 -> 16: 0.5
        (200, 4, 32, 32),  # 25: 25/16 >= 0.9, 25/32 < 0.9
        (320, 4, 32, 48),  # 40: 40/32 >= 0.9, 40/48 < 0.9
        (8192, 4, 32, 64),  # 1,024 per expert: 64
        (8192, 4, 128, 64),
    ],
)
def test_marlin_blocks_as_vllm_picks_them(tokens: int, top_k: int, experts: int, block: int) -> None:
    kernel = fp4_experts(H100)
    assert kernel is not None
    assert kernel.block_rows(tokens, top_k, experts) == block


def normal_tail(x: float, mean: float, sd: float) -> float:
    """P(X > x) of a normal distribution."""
    return 0.5 * math.erfc((x - mean) / (sd * math.sqrt(2)))


def test_large_step_streams_weights_per_block_at_the_mma_share() -> None:
    # one gemm of 2880 x 5760 per expert, 32 experts, top-4, 8192 tokens: every expert touched, 1,024 rows
    # each on average, Binomial(8192, 1/8) (sd 29.9): 16 blocks of 64, a 17th when it gets more than 1,024
    # (about half the time), one fewer below 961; E ceil(X / 64) = sum over j of P(X > 64 j), here by the
    # normal approximation; by hand: flops at eta x peak x 2/3 over whole blocks, weights once per block
    blocks = sum(normal_tail(64 * j + 0.5, 1024, math.sqrt(8192 / 8 * 7 / 8)) for j in range(40))
    assert expected_blocks(8192, 4, 32, 64) / 32 == pytest.approx(blocks, abs=0.01)
    blocks = expected_blocks(8192, 4, 32, 64) / 32
    g = (Gemm(2880, 5760),)
    k = kernels("h100")
    cal, bpp = k.cal, 0.53125
    got = k.experts(8192.0, g, 32.0, bpp, 4, 32)
    flops = 2 * 32 * blocks * 64 * 2880 * 5760 / (cal.linear_flops_eff * H100.bf16_flops * HOPPER_MMA_SYNC_SHARE)
    moved = (32 * blocks * 2880 * 5760 * bpp + 2 * 8192 * 4 * (2880 + 5760)) / (
        cal.linear_bw_eff * H100.hbm_bandwidth_bytes_per_s
    )
    p = cal.linear_blend
    want = cal.moe_floor_s + cal.linear_floor_s + (flops**p + moved**p) ** (1 / p)
    assert got == pytest.approx(want, rel=1e-12)
    assert got > kernels("h100", fp4=False).experts(8192.0, g, 32.0, bpp, 4, 32)


def blocks_by_enumeration(tokens: int, top_k: int, experts: int, block: int) -> float:
    """Mean blocks over every equally likely routing: each token's top_k distinct experts."""
    choices = list(itertools.combinations(range(experts), top_k))
    total = 0
    for routing in itertools.product(choices, repeat=tokens):
        rows = [0] * experts
        for picked in routing:
            for e in picked:
                rows[e] += 1
        total += sum(math.ceil(r / block) for r in rows)
    return total / float(len(choices) ** tokens)


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "block"), [(3, 2, 4, 2), (4, 1, 3, 2), (4, 2, 5, 3), (2, 4, 4, 8)]
)
def test_expected_blocks_match_every_routing_enumerated(tokens: int, top_k: int, experts: int, block: int) -> None:
    assert expected_blocks(tokens, top_k, experts, block) == pytest.approx(
        blocks_by_enumeration(tokens, top_k, experts, block), rel=1e-9
    )


def test_gpt_oss_120b_chunk_on_a100_pads_half_its_experts_to_a_second_block() -> None:
    # 2,048 tokens, top-4 of 128 experts: 64 rows per expert on average, one block of 64 if split evenly;
    # Binomial(2048, 1/32) exceeds 64 rows about half the time (sd 7.9); checked against routings drawn at random
    kernel = fp4_experts(A100)
    assert kernel is not None and kernel.block_rows(2048, 4, 128) == 64
    per_expert = expected_blocks(2048, 4, 128, 64) / 128
    sd = math.sqrt(2048 / 32 * 31 / 32)
    assert per_expert == pytest.approx(normal_tail(0.5, 64, sd) + normal_tail(64.5, 64, sd), abs=0.01)
    rng = np.random.default_rng(7)
    picks = np.argsort(rng.random((60, 2048, 128)), axis=2)[:, :, :4]
    rows = np.stack([np.bincount(p.ravel(), minlength=128) for p in picks])
    assert per_expert == pytest.approx(float(np.ceil(rows / 64).mean()), rel=0.02)


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(0, 3000),
    top_k=st.integers(1, 8),
    experts=st.integers(8, 160),
    block=st.sampled_from((8, 16, 32, 48, 64)),
)
def test_expected_blocks_lie_between_the_even_split_and_one_partial_block_per_touched_expert(
    tokens: int, top_k: int, experts: int, block: int
) -> None:
    # E ceil(X / B) >= E X / B; and ceil(x / B) < x / B + 1 for every x > 0, so at most one partial block
    # per expert that got rows (touched with probability 1 - (1 - k / E)^T)
    got = expected_blocks(tokens, top_k, experts, block)
    rows = tokens * top_k
    touched = experts * (1 - (1 - top_k / experts) ** tokens)
    assert rows / block - 1e-9 <= got <= rows / block + touched + 1e-9


def test_one_token_on_ampere_is_one_block_of_eight_rows_at_the_peak() -> None:
    # decode of one token: 4 touched experts, one block each of Marlin's smallest (8 rows), mma.sync at the
    # peak: the weights stream once as in the generic model; only the math of 8 rows instead of 16 differs
    g = (Gemm(2880, 5760),)
    k = kernels("a100")
    cal, bpp = k.cal, 0.53125
    flops = 2 * 4 * 8 * 2880 * 5760 / (cal.linear_flops_eff * A100.bf16_flops)
    moved = (4 * 2880 * 5760 * bpp + 2 * 1 * 4 * (2880 + 5760)) / (cal.linear_bw_eff * A100.hbm_bandwidth_bytes_per_s)
    p = cal.linear_blend
    want = cal.moe_floor_s + cal.linear_floor_s + (flops**p + moved**p) ** (1 / p)
    assert k.experts(1.0, g, 4.0, bpp, 4, 32) == pytest.approx(want, rel=1e-12)


def test_only_four_bit_experts_take_the_kernel() -> None:
    g = (Gemm(4096, 14336),)
    for bpp in (1.0, 2.0):  # FP8 and bf16 experts: the generic cost, on every GPU
        assert kernels("h100").experts(4096.0, g, 8.0, bpp, 2, 8) == kernels("h100", fp4=False).experts(
            4096.0, g, 8.0, bpp, 2, 8
        )


def test_gpt_oss_storage_is_mxfp4_experts_and_bf16_rest() -> None:
    spec = load_model_spec("gpt-oss-20b", max_seq_len=4096)
    model = StepTimeModel.build(spec, H100, load_weights("gpt-oss-20b"))
    # 4 bits and one 1-byte E8M0 scale per 32 values: 0.5 + 1/32 bytes; attention, router, lm_head bf16
    assert model.storage is not None
    assert model.storage[0] == 2.0 and model.storage[1] == pytest.approx(0.5 + 1 / 32)
    assert expert_storage(load_model_spec("qwen3-8b").config, model.shapes) is None
    dense = StepTimeModel.build(load_model_spec("llama-3.1-8b-instruct"), H100, load_weights("llama-3.1-8b-instruct"))
    assert dense.storage is None


def test_dense_models_cost_the_same_on_every_architecture() -> None:
    # a GPU whose architecture the table does not know prices bf16 weights exactly as before
    spec = load_model_spec("llama-3.1-8b-instruct")
    weights = load_weights("llama-3.1-8b-instruct")
    a = StepTimeModel.build(spec, H100, weights)
    b = StepTimeModel.build(spec, dataclasses.replace(H100, arch=""), weights)
    for decodes, prefills in (([(1000, 0)] * 64, []), ([], [(0, 4096)])):
        assert a.time(decodes, prefills) == b.time(decodes, prefills)
