"""Factories of the simulator tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool.presets import GpuSpec
from kvpool.spec import ModelSpec, load_model_spec

# A GPU with round numbers: 100 TFLOPS BF16, 1 TB/s, 10 GiB, no FP8 unless given.
TOY_GPU = GpuSpec(
    key="toy",
    name="toy",
    memory_bytes=10 * 2**30,
    hbm_bandwidth_bytes_per_s=1e12,
    bf16_flops=1e14,
    fp8_flops=None,
    memory_source="marketed",
    source="test",
)


def toy_gpu(**changes: Any) -> GpuSpec:
    """TOY_GPU with `changes` (e.g. fp8_flops=2e14, a host link)."""
    return dataclasses.replace(TOY_GPU, **changes)


def toy_spec(tpb: int = 4, window: int | None = None) -> ModelSpec:
    """2 layers x 2 KV heads x head_dim 16 x (K, V) x 2 bytes = 256 bytes per
    position; with `window`, a sliding layer before the full one."""
    config: dict[str, object] = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_size": 64,
        "max_position_embeddings": 1 << 16,
        "torch_dtype": "bfloat16",
    }
    if window:
        config.update(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    return load_model_spec(config, tokens_per_block=tpb)
