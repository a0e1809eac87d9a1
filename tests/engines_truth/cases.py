"""The deployments on which kvpool's engine models are checked against the
engines' own sizing code (tests/test_engines_truth.py). Pure data: each case
names a config.json under tests/data/configs (published files, SOURCES.md there)
and the engine's launch settings. Budgets include odd byte counts and budgets
one block either side of refusal (the null block makes `needed + 1 block`
the smallest that starts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).parents[1] / "data" / "configs"
DRAFTS = Path(__file__).parent / "drafts"
JAMBA = str(Path(__file__).parent / "jamba-v0.1-cache-fields.json")
FALCON_H1 = str(Path(__file__).parent / "falcon-h1-7b-cache-fields.json")
GIB, MIB = 1 << 30, 1 << 20


def _vllm(
    cid: str,
    model: str,
    memory: int,
    L: int,
    *,
    tp: int = 1,
    bs: int = 16,
    N: int = 8192,
    B: int = 256,
    kv: str = "auto",
    async_scheduling: bool = True,
    pp: int = 1,
    draft: dict[str, Any] | None = None,
    ssm: str = "auto",
    config: str | None = None,
) -> dict[str, Any]:
    return {
        "draft": draft,
        "mamba_ssm_cache_dtype": ssm,
        "id": cid,
        "model": model,
        "config": config or str(CONFIGS / f"{model}.json"),
        "tp": tp,
        "pp": pp,
        "block_size": bs,
        "kv_dtype": kv,
        "memory": memory,
        "max_model_len": L,
        "max_num_batched_tokens": N,
        "max_num_seqs": B,
        "async_scheduling": async_scheduling,
    }


# Llama-3.1-8B, bf16, TP 1: 32 layers x 2 x 8 x 128 x 2 B = 128 KiB per token;
# a 16-token block over all layers is 2 MiB, so L = 8192 needs 512 blocks = 1 GiB.
LLAMA8_BLOCK = 2 * MIB

VLLM_CASES: list[dict[str, Any]] = [
    _vllm("llama8-20g", "Meta-Llama-3.1-8B", 20 * GIB, 8192),
    _vllm("llama8-odd", "Meta-Llama-3.1-8B", 7_777_777_777, 131072),
    _vllm("llama8-bs32", "Meta-Llama-3.1-8B", 9_999_999_999, 32768, bs=32),
    _vllm("llama8-bs64", "Meta-Llama-3.1-8B", 3 * GIB + 12345, 16384, bs=64),
    _vllm("llama8-edge-refuse", "Meta-Llama-3.1-8B", GIB, 8192),
    _vllm("llama8-edge-refuse-1", "Meta-Llama-3.1-8B", GIB + LLAMA8_BLOCK - 1, 8192),
    _vllm("llama8-edge-start", "Meta-Llama-3.1-8B", GIB + LLAMA8_BLOCK, 8192),
    _vllm("llama8-one-block", "Meta-Llama-3.1-8B", LLAMA8_BLOCK + 100, 8192),
    _vllm("llama8-two-blocks", "Meta-Llama-3.1-8B", 2 * LLAMA8_BLOCK, 16),
    _vllm("llama8-small", "Meta-Llama-3.1-8B", 100 * MIB + 7, 8192),
    _vllm("llama8-fp8", "Meta-Llama-3.1-8B", 11 * GIB, 65536, kv="fp8"),
    _vllm("llama70-tp2", "Meta-Llama-3.1-70B", 30 * GIB, 32768, tp=2),
    _vllm("llama70-tp4", "Meta-Llama-3.1-70B", 25 * GIB + 1, 131072, tp=4),
    _vllm("llama70-tp8-bs32", "Meta-Llama-3.1-70B", 13 * GIB, 131072, tp=8, bs=32),
    _vllm("llama70-tp8-refuse", "Meta-Llama-3.1-70B", 2 * GIB, 131072, tp=8),
    _vllm("llama1b", "Llama-3.2-1B-Instruct", 3 * GIB + 333, 131072),
    _vllm("qwen25-7b-tp4", "Qwen2.5-7B-Instruct", 5 * GIB, 32768, tp=4),
    _vllm("qwen3-8b", "Qwen3-8B", 17 * GIB, 40960),
    _vllm("qwen3-32b-tp2-bs64", "Qwen3-32B", 37 * GIB + 99, 40960, tp=2, bs=64),
    _vllm("qwen3-0.6b", "Qwen3-0.6B", 1_234_567_891, 40960, N=2048),
    _vllm("qwen3-235b-tp8", "Qwen3-235B-A22B", 40 * GIB, 40960, tp=8),
    _vllm("qwen3-30b-tp4", "Qwen3-30B-A3B", 9 * GIB, 40960, tp=4),
    _vllm("phi4", "phi-4", 12 * GIB, 16384),
    _vllm("mixtral-8x7b-tp2", "Mixtral-8x7B-v0.1", 21 * GIB, 32768, tp=2),
    _vllm("olmo3-32b", "Olmo-3.1-32B-Instruct", 30 * GIB, 65536),
    _vllm("gemma3-27b-20g", "gemma-3-27b-it", 20 * GIB, 32768),
    _vllm("gemma3-27b-20g-sync", "gemma-3-27b-it", 20 * GIB, 32768, async_scheduling=False),
    _vllm("gemma3-27b-10g-8k", "gemma-3-27b-it", 10 * GIB, 8192),
    _vllm("gemma3-27b-tp2-bs32", "gemma-3-27b-it", 15 * GIB + 5, 131072, tp=2, bs=32),
    _vllm("gemma3-27b-tp4-n2k", "gemma-3-27b-it", 6 * GIB, 131072, tp=4, N=2048),
    _vllm("gemma3-27b-refuse", "gemma-3-27b-it", GIB, 131072),
    _vllm("gemma3-4b", "gemma-3-4b-it", 4 * GIB + 17, 131072),
    _vllm("gemma3-4b-bs64-sync", "gemma-3-4b-it", 2 * GIB, 32768, bs=64, async_scheduling=False),
    _vllm("gemma2-9b-L4096", "gemma-2-9b-it", 11 * GIB, 4096),
    _vllm("gemma2-9b-L8192", "gemma-2-9b-it", 11 * GIB, 8192),
    _vllm("gemma2-9b-L2048-sync", "gemma-2-9b-it", 3 * GIB, 2048, async_scheduling=False),
    _vllm("gpt-oss-20b", "gpt-oss-20b", 20 * GIB, 131072),
    _vllm("gpt-oss-20b-n512", "gpt-oss-20b", 1 * GIB + 1, 131072, N=512),
    _vllm("gpt-oss-120b-tp2", "gpt-oss-120b", 30 * GIB, 131072, tp=2),
    _vllm("gpt-oss-120b-tp8-sync", "gpt-oss-120b", 7 * GIB, 131072, tp=8, async_scheduling=False),
    _vllm("deepseek-v3-tp8", "DeepSeek-V3", 50 * GIB, 163840, tp=8, bs=64),
    _vllm("deepseek-v3-refuse", "DeepSeek-V3", GIB, 163840, tp=8, bs=64),
    _vllm("deepseek-r1-fp8", "DeepSeek-R1", 13 * GIB + 3, 163840, tp=8, bs=64, kv="fp8"),
    _vllm("llama4-scout-tp4", "Llama-4-Scout-17B-16E-Instruct", 30 * GIB, 262144, tp=4),
    _vllm("llama4-scout-tp8-sync", "Llama-4-Scout-17B-16E-Instruct", 9 * GIB, 131072, tp=8, async_scheduling=False),
    _vllm("llama4-maverick-tp8", "Llama-4-Maverick-17B-128E-Instruct", 40 * GIB, 524288, tp=8),
    # Pipeline parallelism: every stage sizes its own layers, the pool is the smallest stage's.
    # Synchronous only: with async scheduling the GPU's model runner V2 keeps pp + 1 batches
    # in flight, and V2 needs Triton, which this CPU wheel's config refuses.
    _vllm("llama70-pp2-sync", "Meta-Llama-3.1-70B", 20 * GIB, 32768, pp=2, async_scheduling=False),
    _vllm("gemma3-27b-pp2-sync", "gemma-3-27b-it", 10 * GIB, 32768, pp=2, async_scheduling=False),
    _vllm("gpt-oss-20b-pp4-sync", "gpt-oss-20b", 5 * GIB, 131072, pp=4, async_scheduling=False),
    # Mamba-2 (Nemotron-H): vLLM raises the attention block size until a page holds one
    # Mamba state (Platform._align_hybrid_block_size), from --block-size 16 or a larger one.
    _vllm("nemotron-h-56b", "Nemotron-H-56B-Base-8K", 20 * GIB, 8192),
    _vllm("nemotron-h-56b-tp4", "Nemotron-H-56B-Base-8K", 7 * GIB + 5, 8192, tp=4, B=64),
    _vllm("nemotron-h-56b-tp4-bs1040", "Nemotron-H-56B-Base-8K", 7 * GIB + 5, 8192, tp=4, bs=1040, B=64),
    _vllm("nemotron-h-56b-tp8-sync", "Nemotron-H-56B-Base-8K", 3 * GIB, 8192, tp=8, B=32, async_scheduling=False),
    # Jamba (Mamba-1): the state's SSM part follows --mamba-ssm-cache-dtype (auto: the model's bf16; float32 as
    # its model card recommends), so the page vLLM aligns to doubles: 80 / 96 tokens at --block-size 16 / 32
    # in bf16, 144 / 160 in float32. The config holds the cache-shaping fields of ai21labs/Jamba-v0.1 (README).
    *(
        _vllm(
            f"jamba-v0.1-bs{bs}-ssm-{ssm}{'-tp2' if tp > 1 else ''}",
            "jamba",
            20 * GIB,
            8192,
            bs=bs,
            tp=tp,
            ssm=ssm,
            config=JAMBA,
        )
        for bs, ssm, tp in (
            (16, "auto", 1),
            (32, "auto", 1),
            (16, "float32", 1),
            (32, "float32", 1),
            (32, "float32", 2),
        )
    ),
    # Falcon-H1-7B (attention and Mamba-2 in every layer): 1,568-token pages in bf16, 3,104 in float32.
    *(
        _vllm(
            f"falcon-h1-7b-ssm-{ssm}{'-tp2' if tp > 1 else ''}",
            "falcon-h1",
            30 * GIB,
            16384,
            tp=tp,
            ssm=ssm,
            config=FALCON_H1,
        )
        for ssm, tp in (("auto", 1), ("float32", 1), ("float32", 2))
    ),
]


def _draft(method: str, k: int, *, config: str | None = None, layers: int | None = None) -> dict[str, Any]:
    """A drafter: `method` as vLLM names it, `k` speculative tokens, a draft config
    (an EAGLE head under drafts/, or a published model under tests/data/configs) or MTP `layers`."""
    where = (
        None
        if config is None
        else str(DRAFTS / f"{config}.json" if config.startswith("eagle") else CONFIGS / f"{config}.json")
    )
    return {"method": method, "num_speculative_tokens": k, "config": where, "layers": layers}


# Speculative decoding: the drafter's layers register after the target's and join the KV cache
# groups of their spec (an EAGLE-3 head on gpt-oss: 12 sliding + 13 full layers, groups of 13);
# multi-module MTP retains k - 1 more tokens in every sliding window.
VLLM_SPEC_CASES: list[dict[str, Any]] = [
    _vllm("gpt-oss-20b-eagle3", "gpt-oss-20b", 20 * GIB, 131072, draft=_draft("eagle3", 3, config="eagle3-gpt-oss")),
    _vllm(
        "gpt-oss-120b-tp2-eagle3",
        "gpt-oss-120b",
        30 * GIB,
        131072,
        tp=2,
        draft=_draft("eagle3", 3, config="eagle3-gpt-oss"),
    ),
    _vllm(
        "gemma3-27b-eagle3", "gemma-3-27b-it", 20 * GIB, 32768, draft=_draft("eagle3", 3, config="eagle3-gemma3-27b")
    ),
    _vllm(
        "llama8-eagle3", "Meta-Llama-3.1-8B", 9 * GIB + 7, 32768, draft=_draft("eagle3", 3, config="eagle3-llama3.1-8b")
    ),
    _vllm("deepseek-v3-tp8-mtp", "DeepSeek-V3", 50 * GIB, 163840, tp=8, bs=64, draft=_draft("mtp", 1, layers=1)),
    _vllm(
        "deepseek-r1-fp8-mtp3",
        "DeepSeek-R1",
        13 * GIB + 3,
        163840,
        tp=8,
        bs=64,
        kv="fp8",
        draft=_draft("mtp", 3, layers=1),
    ),
    _vllm("qwen3-8b-draft-0.6b", "Qwen3-8B", 17 * GIB, 40960, draft=_draft("draft_model", 4, config="Qwen3-0.6B")),
    _vllm(
        "qwen3-32b-tp2-draft-0.6b",
        "Qwen3-32B",
        37 * GIB + 99,
        40960,
        tp=2,
        bs=64,
        draft=_draft("draft_model", 4, config="Qwen3-0.6B"),
    ),
    _vllm(
        "llama70-tp4-draft-1b",
        "Meta-Llama-3.1-70B",
        25 * GIB + 1,
        131072,
        tp=4,
        draft=_draft("draft_model", 4, config="Llama-3.2-1B-Instruct"),
    ),
    # Gemma 3 has no MTP layers: three of its full layers as multi-module MTP (k = 3) is a made-up drafter
    # that makes vLLM retain k - 1 = 2 more tokens in its sliding windows.
    _vllm("gemma3-27b-mtp3-made-up", "gemma-3-27b-it", 10 * GIB, 8192, draft=_draft("mtp", 3, layers=3)),
    _vllm("gemma3-27b-mtp3-made-up-refuse", "gemma-3-27b-it", GIB, 131072, draft=_draft("mtp", 3, layers=3)),
]


def _sglang(
    cid: str,
    model: str,
    memory: int,
    L: int,
    *,
    tp: int = 1,
    page: int = 1,
    N: int = 8192,
    kv: str = "auto",
    max_running_requests: int | None = None,
    swa_full_tokens_ratio: float | None = None,
) -> dict[str, Any]:
    return {
        "id": cid,
        "model": model,
        "config": str(CONFIGS / f"{model}.json"),
        "tp": tp,
        "page_size": page,
        "kv_dtype": kv,
        "memory": memory,
        "context_length": L,
        "chunked_prefill_size": N,
        "max_running_requests": max_running_requests,
        "swa_full_tokens_ratio": swa_full_tokens_ratio,
    }


# SGLang sizes its pools from the KV budget left after --mem-fraction-static
# (the `memory` here); the cases cover full attention, MLA, hybrid SWA (gpt-oss,
# Llama 4's chunked layers), sliding models SGLang sizes as full (Gemma 2/3),
# page sizes 1/16/64, TP 1-8, request caps, and SWA pools at the edge of refusal.
SGLANG_CASES: list[dict[str, Any]] = [
    _sglang("sg-llama8", "Meta-Llama-3.1-8B", 20 * GIB, 8192),
    _sglang("sg-llama8-odd-p16", "Meta-Llama-3.1-8B", 7_777_777_777, 131072, page=16),
    _sglang("sg-llama8-cap", "Meta-Llama-3.1-8B", 3 * GIB, 8192, max_running_requests=64),
    _sglang("sg-llama8-cap-above-half", "Meta-Llama-3.1-8B", 50 * MIB, 8192, max_running_requests=512),
    _sglang("sg-llama8-tiny", "Meta-Llama-3.1-8B", 100 * MIB + 7, 8192, page=64),
    _sglang("sg-llama70-tp4-p16", "Meta-Llama-3.1-70B", 10_000_000_000, 8192, tp=4, page=16),
    _sglang("sg-llama70-tp8", "Meta-Llama-3.1-70B", 30 * GIB, 131072, tp=8),
    _sglang("sg-qwen3-8b", "Qwen3-8B", 17 * GIB + 3, 40960),
    _sglang("sg-qwen3-32b-tp2-p64", "Qwen3-32B", 37 * GIB, 40960, tp=2, page=64),
    _sglang("sg-qwen25-7b-tp4", "Qwen2.5-7B-Instruct", 5 * GIB, 32768, tp=4),
    _sglang("sg-qwen3-235b-tp8", "Qwen3-235B-A22B", 40 * GIB, 40960, tp=8, max_running_requests=256),
    _sglang("sg-phi4", "phi-4", 12 * GIB, 16384),
    _sglang("sg-mixtral-tp2", "Mixtral-8x7B-v0.1", 21 * GIB, 32768, tp=2),
    _sglang("sg-deepseek-v3-tp8-p64", "DeepSeek-V3", 10_000_000_000, 163840, tp=8, page=64),
    _sglang("sg-deepseek-r1-tp8", "DeepSeek-R1", 50 * GIB, 163840, tp=8, page=64, max_running_requests=128),
    _sglang("sg-gemma3-27b-tp2", "gemma-3-27b-it", 10_000_000_000, 8192, tp=2),
    _sglang("sg-gemma3-4b", "gemma-3-4b-it", 4 * GIB, 131072),
    _sglang("sg-gemma2-9b", "gemma-2-9b-it", 11 * GIB, 8192),
    _sglang("sg-gpt-oss-20b", "gpt-oss-20b", 1_000_000_000, 8192),
    _sglang("sg-gpt-oss-20b-p16", "gpt-oss-20b", 20 * GIB, 131072, page=16),
    # docs/engines.md's example: kvpool plan gpt-oss-20b --kv-memory 20GiB --max-seq-len 131072 --engine sglang
    _sglang("sg-gpt-oss-20b-20g-cap256", "gpt-oss-20b", 20 * GIB, 131072, max_running_requests=256),
    _sglang("sg-gpt-oss-20b-ratio", "gpt-oss-20b", 5 * GIB + 1, 131072, swa_full_tokens_ratio=0.25),
    _sglang("sg-gpt-oss-120b-tp2", "gpt-oss-120b", 30 * GIB, 131072, tp=2),
    _sglang("sg-gpt-oss-120b-tp8-cap", "gpt-oss-120b", 7 * GIB, 131072, tp=8, max_running_requests=100),
    # gpt-oss-20b, TP 1: 12 full + 12 sliding (W 128) layers of 24,576 B per token each; at ratio 0.2
    # a full token costs 1.2 x 24,576 B, so 650 full tokens (19,169,280 B) give an SWA pool of 130
    # tokens, the least above the floor W + page = 129; 649 give 129 and SGLang refuses.
    _sglang("sg-gpt-oss-20b-swa-edge-start", "gpt-oss-20b", 19_169_280 + 100, 8192, swa_full_tokens_ratio=0.2),
    _sglang("sg-gpt-oss-20b-swa-edge-refuse", "gpt-oss-20b", 19_169_280 - 100, 8192, swa_full_tokens_ratio=0.2),
    _sglang("sg-gpt-oss-20b-fp8", "gpt-oss-20b", 3 * GIB, 131072, kv="fp8"),
    _sglang("sg-llama4-scout-tp4", "Llama-4-Scout-17B-16E-Instruct", 30 * GIB, 262144, tp=4),
    _sglang("sg-llama4-scout-tp8-p64", "Llama-4-Scout-17B-16E-Instruct", 9 * GIB, 131072, tp=8, page=64),
]
