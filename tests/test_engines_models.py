"""Engine models: hand-computed splits of vLLM, SGLang and TensorRT-LLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvpool import ServingLimits, load_model_spec
from kvpool.engines import EngineModel, EngineNotModelledError, allocate_with, sglang, trtllm, vllm
from kvpool.engines.common import split_engine_name

GIB = 2**30
PRESETS = Path(__file__).parents[1] / "src/kvpool/presets/data/models"


def spec(name: str, max_seq_len: int = 8192):  # type: ignore[no-untyped-def]
    return load_model_spec(name, max_seq_len=max_seq_len)


def test_vllm_gemma3_groups_of_ten_with_padding() -> None:
    # 52 sliding + 10 full layers, 16 KV heads x 128, bf16: 2*16*128*2 = 8192 bytes
    # per position per layer, a 16-token page is 131,072 bytes for every layer.
    # Group size = 10 (52 >= 1.5 * 10): ceil(52/10) = 6 sliding groups (8 padding
    # layers) + 1 full group = 7 groups; num_blocks = 10 GiB // 131072 // 10.
    r = vllm.allocate(spec("gemma-3-27b"), ServingLimits(max_seq_len=8192), 10 * GIB)
    blocks = 10 * GIB // 131072 // 10
    assert blocks == 8192
    assert r.reported["kv_cache_groups"] == 7
    assert r.reported["padding_layers"] == 8
    assert r.reported["num_gpu_blocks"] == blocks
    # A request at 8192 takes 512 full blocks + 6 x (ceil(min(1023 + 2 x 8192, 8192)/16) + 1)
    # (async scheduling keeps two batches of 8192 tokens in flight; capped at L).
    per_request = 512 + 6 * 513
    # vLLM 0.32 prints int(concurrency x max_model_len) tokens in one line with the concurrency;
    # tests/engines_truth/ case gemma3-27b-10g-8k has vLLM's own 18,693 tokens, 2.28x.
    assert r.reported["gpu_kv_cache_tokens"] == int(blocks / per_request * 8192) == 18693
    assert r.lines == (
        f"GPU KV cache size: 18,693 tokens, Maximum concurrency for 8,192 tokens per request: {blocks / per_request:.2f}x",
    )
    assert r.lines[0].endswith("2.28x")
    assert any("Add 8 padding layers" in d and "15.38%" in d for d in r.degradations)
    assert r.total_bytes == 10 * GIB  # the padding layers' tensors are allocated too
    # vLLM's printed concurrency assumes whole windows; a decode at 8192 really
    # holds 512 full blocks + 6 x (512 - (8191 + 1 - 1024) // 16) live sliding blocks.
    assert r.max_requests((8192, 8191)) == blocks // (512 + 6 * (512 - 448)) == 9


def test_vllm_hybrid_manager_off_sizes_sliding_as_full() -> None:
    r = vllm.allocate(spec("gemma-3-27b"), ServingLimits(max_seq_len=8192), 10 * GIB, hybrid_manager=False)
    blocks = 10 * GIB // (62 * 131072)
    assert r.reported["kv_cache_groups"] == 1
    assert r.reported["gpu_kv_cache_tokens"] == blocks * 16
    assert r.reported["max_concurrency"] == round(blocks / 512, 2)
    assert any("Hybrid KV cache manager is disabled" in d for d in r.degradations)


def test_vllm_gemma4_unifies_page_sizes_by_block_size() -> None:
    # sliding layers: 2*8*256*2 = 8192 B/token/layer; global: 2*2*512*2 = 4096, so
    # the global layers' block size doubles to 32 for one 131,072-byte page.
    r = vllm.allocate(spec("gemma-4-26b-a4b"), ServingLimits(max_seq_len=8192), 10 * GIB)
    blocks = 10 * GIB // 131072 // 5
    assert r.reported["kv_cache_groups"] == 6 and r.reported["num_gpu_blocks"] == blocks
    per_request = 8192 // 32 + 5 * (-(-min(1023 + 8192, 8192) // 16) + 1)
    assert r.reported["max_concurrency"] == round(blocks / per_request, 2)


def qwen3_next_state_bytes_per_layer() -> int:
    cfg = json.loads((PRESETS / "qwen3-next-80b-a3b.json").read_text())["linear_attention"]
    k, v = (
        cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"],
        cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"],
    )
    conv = (2 * k + v) * (cfg["linear_conv_kernel_dim"] - 1) * 2
    ssm = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"] * 2
    return int(conv + ssm)


def test_vllm_qwen3_next_state_pool_below_max_num_seqs_is_refused() -> None:
    state = qwen3_next_state_bytes_per_layer()
    assert state == 1_097_728
    attn = 2 * 2 * 256 * 2  # one full-attention layer's position
    block = 16 * -(-state // (16 * attn))
    assert block == 544
    page = block * attn
    blocks = 4 * GIB // page // 12  # 36 linear + 12 full layers: 4 groups of 12
    s = spec("qwen3-next-80b-a3b")
    r = vllm.allocate(s, ServingLimits(max_seq_len=8192, max_batch_size=512), 4 * GIB)
    assert r.reported["block_size"] == 544 and r.reported["kv_cache_groups"] == 4
    assert r.reported["num_gpu_blocks"] == blocks == 321
    assert r.refusals == (
        f"max_num_seqs (512) exceeds available Mamba cache blocks ({blocks}). Each decode sequence "
        "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower "
        f"max_num_seqs to at most {blocks} or increase gpu_memory_utilization.",
    )
    assert any("544 tokens" in d for d in r.degradations)
    ok = vllm.allocate(s, ServingLimits(max_seq_len=8192, max_batch_size=256), 4 * GIB)
    assert ok.refusals == ()
    # Maximum concurrency: 16 full blocks + 3 state groups x 2 blocks (mode align).
    assert ok.reported["max_concurrency"] == round(blocks / (16 + 3 * 2), 2)


def test_vllm_refuses_when_one_request_does_not_fit() -> None:
    r = vllm.allocate(spec("qwen3-8b", 32768), ServingLimits(max_seq_len=32768), 1 * GIB)
    assert len(r.refusals) == 1 and "estimated maximum model length is" in r.refusals[0]


def test_sglang_gpt_oss_swa_ratio() -> None:
    # 12 full + 12 sliding layers, 8 KV heads x 64 x (K+V) x bf16 = 2048 B each:
    # full = int(mem // (24576 + 0.8 * 24576)), swa = int(full * 0.8).
    mem = 10 * GIB
    full = int(mem // (24576 * 1.8))
    r = sglang.allocate(spec("gpt-oss-20b"), ServingLimits(max_seq_len=8192), mem)
    assert (full, int(full * 0.8)) == (242725, 194180)
    assert r.reported["full_tokens"] == full and r.reported["swa_tokens"] == int(full * 0.8)
    assert r.lines[0] == f"Use sliding window memory pool. full_layer_tokens={full}, swa_layer_tokens=194180"
    assert r.lines[1].startswith(f"KV Cache is allocated. #tokens: {full},")
    assert r.reported["max_running_requests"] == 4096
    assert r.total_bytes <= mem
    half = sglang.allocate(spec("gpt-oss-20b"), ServingLimits(max_seq_len=8192), mem, swa_full_tokens_ratio=0.5)
    assert half.reported["full_tokens"] == int(mem // (24576 * 1.5))


def test_sglang_refuses_a_swa_pool_below_one_request() -> None:
    mem = int(24576 * 1.8 * 150)
    r = sglang.allocate(spec("gpt-oss-20b"), ServingLimits(max_seq_len=8192), mem)
    assert r.reported["swa_tokens"] == int(int(mem // (24576 * 1.8)) * 0.8) <= 128 + 1
    assert r.refusals and "cannot hold even one request" in r.refusals[0]


def test_sglang_mamba_ratio() -> None:
    s = spec("qwen3-next-80b-a3b")
    per_req = 36 * qwen3_next_state_bytes_per_layer()
    mem = 10 * GIB
    # SGLang 0.5.23 _handle_max_mamba_cache: int((budget - per_slot) // per_slot) slots
    # plus one padding slot, both taken from the memory before the KV pool is sized.
    slots = int((mem * 0.9 / 1.9 - per_req) // per_req)
    r = sglang.allocate(s, ServingLimits(max_seq_len=8192), mem, max_running_requests=256)
    assert r.reported["max_mamba_cache_size"] == slots
    assert r.reported["full_tokens"] == (mem - (slots + 1) * per_req) // (12 * 2048)
    assert r.reported["max_running_requests"] == min(256, slots)
    assert any("capped" in d for d in r.degradations)


def test_trtllm_v1_tokens_proportional_to_window() -> None:
    # gpt-oss-20b: both windows take 24,576 B/token, so tokens_W = mem * W / (128 + 8192) / 24576.
    mem = 10 * GIB
    r = trtllm.allocate(spec("gpt-oss-20b"), ServingLimits(max_seq_len=8192), mem)
    t128, t8192 = int(mem * 128 / 8320 / 24576), int(mem * 8192 / 8320 / 24576)
    assert r.lines == (
        f"[windowSize=128] {{.primaryBlocks={-(-t128 // 32)}, .secondayBlocks=0}}",
        f"[windowSize=8192] {{.primaryBlocks={-(-t8192 // 32)}, .secondayBlocks=0}}",
    )
    v2 = trtllm.allocate(spec("gpt-oss-20b"), ServingLimits(max_seq_len=8192), mem, manager="v2")
    assert v2.group_pages is not None and v2.group_pages["sliding"] > r.pool("window_128").pages


def test_compressed_models_are_not_modelled() -> None:
    with pytest.raises(EngineNotModelledError):
        vllm.allocate(load_model_spec("deepseek-v4-flash"), ServingLimits(max_seq_len=8192), GIB)


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(
        ["gemma-3-27b", "gpt-oss-20b", "qwen3-next-80b-a3b", "gemma-4-26b-a4b", "llama-4-scout-17b-16e", "qwen3-8b"]
    ),
    st.integers(min_value=GIB // 2, max_value=80 * GIB),
)
def test_vllm_and_sglang_stay_within_the_budget(name: str, mem: int) -> None:
    s = spec(name)
    for r in (
        vllm.allocate(s, ServingLimits(max_seq_len=8192), mem),
        sglang.allocate(s, ServingLimits(max_seq_len=8192), mem),
    ):
        assert r.total_bytes <= mem
        assert all(p.pages >= 0 for p in r.pools)


def test_sglang_sizes_gemma3_sliding_layers_as_full() -> None:
    # SGLang 0.5.23 gives a hybrid SWA pool only to an allowlist of architectures
    # (gpt-oss, Llama 4, Gemma 4, ...); Gemma 3's 62 layers all go into one pool at
    # 2 x 16 x 128 x 2 B = 8,192 B per token per layer.
    r = sglang.allocate(spec("gemma-3-27b"), ServingLimits(max_seq_len=8192), 10 * GIB)
    assert r.reported["full_tokens"] == 10 * GIB // (62 * 8192) == 21140
    assert r.reported["swa_tokens"] is None
    assert any("no hybrid SWA pool" in n for n in r.notes)


def test_sglang_request_cap_is_at_most_half_the_pool() -> None:
    # Llama-3.1-8B: 32 x 2 x 8 x 128 x 2 B = 131,072 B per token; 50 MiB holds 400 tokens,
    # and resolve_max_num_reqs never grants more than half of them (200) whatever was asked.
    r = sglang.allocate(
        spec("llama-3.1-8b-instruct"), ServingLimits(max_seq_len=8192), 50 * 2**20, max_running_requests=512
    )
    assert r.reported["full_tokens"] == 50 * 2**20 // 131072 == 400
    assert r.reported["max_running_requests"] == 200


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=4 * GIB))
@example(2 * 2**20)
@example(2 * 2**20 + 1)
@example(513 * 2 * 2**20 - 1)
@example(513 * 2 * 2**20)
def test_vllm_starts_only_with_a_null_block_to_spare(memory: int) -> None:
    # Llama-3.1-8B at L 8192: a 16-token block over 32 layers is 2 MiB and one request
    # takes 512 blocks; vLLM's pool keeps one null block back, so it starts only when
    # memory // 2 MiB >= 513, and then reports int(blocks / 512 x 8192) tokens.
    r = vllm.allocate(spec("llama-3.1-8b-instruct"), ServingLimits(max_seq_len=8192), memory)
    blocks = memory // (2 * 2**20)
    assert (not r.refusals) == (blocks >= 513)
    if not r.refusals:
        assert r.reported["gpu_kv_cache_tokens"] == int(blocks / 512 * 8192)
        assert r.reported["usable_blocks"] == blocks - 1
    else:
        # the estimate is the longest length whose blocks fit next to the null block;
        # with no memory beyond that block vLLM says there is none at all
        none_left = memory <= 2 * 2**20
        assert r.reported.get("estimated_max_model_len") == (None if none_left else 16 * (blocks - 1))
        assert r.refusals[0].startswith("No available memory" if none_left else "To serve at least one request")


def test_engine_models_follow_the_protocol() -> None:
    s, lim = spec("gemma-3-27b"), ServingLimits(max_seq_len=8192)
    model: EngineModel[Any] = vllm.Vllm(block_size=32, async_scheduling=False)
    assert (model.engine, model.release) == ("vllm", vllm.RELEASES[0]) == ("vllm", "0.33")
    assert allocate_with(model, s, lim, 10 * GIB) == vllm.allocate(
        s, lim, 10 * GIB, block_size=32, async_scheduling=False
    )
    sg: EngineModel[Any] = sglang.Sglang(page_size=16)
    assert allocate_with(sg, s, lim, 10 * GIB) == sglang.allocate(s, lim, 10 * GIB, page_size=16)
    assert split_engine_name("vllm", {"vllm": ("0.32",)}) == ("vllm", "0.32")
    with pytest.raises(EngineNotModelledError, match="vllm@0.10"):
        split_engine_name("vllm@0.10", {"vllm": ("0.32",)})
