"""Simulator policies engine:vllm / engine:sglang / engine:trtllm."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.engines import sglang, trtllm, vllm
from kvpool.errors import KvpoolError
from kvpool.plan import ServingLimits
from kvpool.presets import GpuSpec
from kvpool.sim import StepTimeModel, Weights, simulate
from kvpool.sim.policies import parse_policies, plan_for
from kvpool.spec import load_model_spec
from kvpool.trace import Trace
from plan_helpers import hybrid

GiB = 2**30
LIMITS = ServingLimits(max_seq_len=8192)
TRACE = Trace("t", np.array([1000, 3000, 200]), np.array([100, 200, 50]))
GPU = GpuSpec("toy", "toy", 80 * GiB, 3e12, 1e15, None, "marketed", "test")
WEIGHTS = Weights(27e9, 27e9, 2.0)


def test_engine_policies_parse() -> None:
    assert parse_policies("engine:vllm,engine:sglang,engine:trtllm,workload") == [
        "engine:vllm",
        "engine:sglang",
        "engine:trtllm",
        "workload",
    ]
    with pytest.raises(KvpoolError, match="engine:vllm"):
        parse_policies("engine:foo")


def test_sglang_and_trtllm_pools_become_pages() -> None:
    spec = load_model_spec("gpt-oss-20b", max_seq_len=8192)
    sg = plan_for(spec, LIMITS, "engine:sglang", kv_memory_bytes=10 * GiB, trace=TRACE).plan
    r = sglang.allocate(spec, LIMITS, 10 * GiB, max_running_requests=256)
    assert sg.pages("full") == r.reported["full_tokens"] // 32
    assert sg.pages("sliding") == r.reported["swa_tokens"] // 32
    assert sg.policy == "engine:sglang"
    tr = plan_for(spec, LIMITS, "engine:trtllm", kv_memory_bytes=10 * GiB, trace=TRACE).plan
    # gpt-oss-20b's sliding and full layers are alike (12 each): V2 gives them one pool group of equal slots
    v2 = trtllm.allocate(spec, LIMITS, 10 * GiB, manager="v2-default")
    assert v2.group_pages is None and len(tr.shared) == 1 and tr.shared[0].pages == v2.pools[0].pages


def test_trtllm_policy_sizes_pools_as_v2_gemma4() -> None:
    # TensorRT-LLM V2 gives gemma-4-26b-a4b fp8 at 60 GiB sliding 15,728 / full 39,321 slots (V1 splits by window)
    spec = load_model_spec("gemma-4-26b-a4b", kv_dtype="fp8", max_seq_len=32768)
    lim = ServingLimits(max_seq_len=32768, max_batch_size=256)
    plan = plan_for(spec, lim, "engine:trtllm", kv_memory_bytes=60 * GiB, trace=TRACE).plan
    assert (plan.pages("sliding"), plan.pages("full")) == (15_728, 39_321)


def test_trtllm_policy_one_pool_group_is_one_shared_pool() -> None:
    # equal row bytes: V2's sliding and full life cycles have equal slot sizes and share one pool group
    # (test_storage_manager.py's merged case); 1 GiB at 2 MiB grains holds 512 x 2 MiB // 32,768 B slots
    spec = hybrid(full_row=1024, sliding_row=1024, window=1024)
    report = trtllm.allocate(spec, LIMITS, GiB, manager="v2-default")
    assert report.group_pages is None and report.pools[0].pages == GiB // (1024 * 32)
    plan = plan_for(spec, LIMITS, "engine:trtllm", kv_memory_bytes=GiB, trace=TRACE).plan
    assert len(plan.shared) == 1 and plan.shared[0].pages == GiB // (1024 * 32)
    assert plan.policy == "engine:trtllm"


def test_vllm_policy_is_one_shared_pool_gemma3() -> None:
    # Gemma-3-27B: 62 layers (52 sliding of W 1024, 10 full), 16 KV heads x 128 dims in bf16:
    # 2 (K, V) x 16 x 128 x 2 B = 8,192 B per position per layer, every layer alike.
    # vLLM: group size 10 (52 >= 1.5 x 10), so 6 sliding groups (8 padding layers) + 1 full;
    # a block at the simulated 32 positions holds 10 layers: 10 x 8,192 x 32 = 2,621,440 B.
    # 20 GiB / 2,621,440 B = 8,192 blocks, one of them vLLM's null block (never handed out).
    spec = load_model_spec("gemma-3-27b", max_seq_len=8192)
    plan = plan_for(spec, LIMITS, "engine:vllm", kv_memory_bytes=20 * GiB, trace=TRACE).plan
    assert len(plan.shared) == 1 and plan.shared[0].pages == 8192 - 1
    assert plan.shared[0].page_bytes == 2_621_440 and plan.total_bytes == 20 * GiB - 2_621_440
    assert plan.spec.tokens_per_block == 32
    kinds = [(g.kind, g.window) for g in plan.spec.groups]
    assert kinds == [("sliding", 1024)] * 6 + [("full", None)]
    assert all(plan.pages(g.name) == 8191 for g in plan.spec.groups)
    assert sorted(set(plan.origin.values())) == ["full", "sliding"]
    assert plan.share_of("sliding") == pytest.approx(6 / 7)  # 6 of the pool's 7 groups (padding included)
    # the same count vllm.allocate prints at --block-size 32
    assert vllm.allocate(spec, LIMITS, 20 * GiB, block_size=32).reported["num_gpu_blocks"] == 8192


def test_vllm_policy_repeats_groups_of_smaller_blocks_gemma4() -> None:
    # Gemma-4-26B-A4B, fp8 KV: 25 sliding layers of 8 KV heads x 256 dims (2 x 8 x 256 x 1 B =
    # 4,096 B per position) and 5 global layers of 2 heads x 512 (2 x 2 x 512 x 1 B = 2,048 B).
    # vLLM: groups of 5 layers (25 >= 1.5 x 5): 5 sliding + 1 global; pages unified by doubling
    # the global block to 64 positions: a block is 5 x 4,096 x 32 = 655,360 B, and
    # 60 GiB / 655,360 B = 98,304 blocks. Simulated at 32 positions a page is half a block
    # (327,680 B, one global block of 32 positions): 196,608 pages; each sliding group's
    # 32-position block costs two pages, so each appears twice: 5 x 2 + 1 = 11 groups.
    spec = load_model_spec("gemma-4-26b-a4b", kv_dtype="fp8", max_seq_len=32768)
    lim = ServingLimits(max_seq_len=32768)
    plan = plan_for(spec, lim, "engine:vllm", kv_memory_bytes=60 * GiB, trace=TRACE).plan
    # less vLLM's null block (two pages of 32 positions)
    assert plan.shared[0].pages == 196_608 - 2 and plan.shared[0].page_bytes == 327_680
    assert plan.total_bytes == 60 * GiB - 655_360
    assert [g.kind for g in plan.spec.groups].count("sliding") == 10 and len(plan.spec.groups) == 11


def test_vllm_shared_pool_simulates_consistently() -> None:
    # a tight pool (1.5 GiB: 614 blocks of 10 layers; a 2,000-token request takes 63 full and
    # 6 x 33 sliding blocks) so that requests wait and are preempted
    spec = load_model_spec("gemma-3-27b", max_seq_len=4096)
    lim = ServingLimits(max_seq_len=4096, max_num_tokens=512)
    plan = plan_for(spec, lim, "engine:vllm", kv_memory_bytes=3 * GiB // 2, trace=TRACE).plan
    rng = np.random.default_rng(3)
    trace = Trace("t", rng.integers(200, 3000, 24), rng.integers(5, 60, 24))
    model = StepTimeModel.build(spec, GPU, WEIGHTS)
    fast = simulate(plan, trace, model, check=True, fast=True)
    slow = simulate(plan, trace, model, check=True, fast=False)
    assert fast.finished == slow.finished == 24
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    assert set(fast.pages) == {"sliding", "full"}  # reported by the model's groups
    assert fast.pages["full"].total == plan.shared[0].pages
    assert fast.end_used == fast.reserved  # no page leaked


def test_engine_that_refuses_is_an_error() -> None:
    spec = load_model_spec("qwen3-next-80b-a3b", max_seq_len=8192)
    with pytest.raises(KvpoolError, match="Mamba cache blocks"):
        plan_for(
            spec,
            ServingLimits(max_seq_len=8192, max_batch_size=512),
            "engine:vllm",
            kv_memory_bytes=4 * GiB,
            trace=TRACE,
        )
