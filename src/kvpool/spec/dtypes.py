"""KV storage dtypes and the exact bytes of one stored row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.errors import SpecError

KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8", "nvfp4")

# What a config's `torch_dtype` / `dtype` field means for `auto`.
_CONFIG_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}
_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


def model_dtype(config: Mapping[str, Any]) -> str:
    """The dtype the checkpoint computes in (bf16 when the config does not say)."""
    raw = config.get("torch_dtype") or config.get("dtype")
    return _CONFIG_DTYPES.get(str(raw).lower(), "bf16") if raw else "bf16"


def resolve_kv_dtype(kv_dtype: str, config: Mapping[str, Any]) -> str:
    """`auto` becomes the config's dtype; anything else must be a known KV dtype."""
    name = str(kv_dtype).lower()
    if name not in KV_DTYPES:
        raise SpecError(f"unsupported kv dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
    return model_dtype(config) if name == "auto" else name


def row_bytes(elements: int, dtype: str) -> int:
    """Bytes of one row of `elements` values stored in `dtype`.

    NVFP4 packs two 4-bit values per byte and keeps one FP8 scale per 16 values
    (NVIDIA's NVFP4 block format), so a 128-value row takes 64 + 8 = 72 bytes.
    """
    if dtype == "nvfp4":
        return -(-elements // 2) + -(-elements // 16)
    if dtype not in _BYTES:
        raise SpecError(f"unsupported kv dtype {dtype!r}")
    return elements * _BYTES[dtype]


def fp8_with_block_scales(elements: int, block: int = 128) -> int:
    """An FP8 row plus one FP32 scale per `block` values (DeepSeek sparse-attention
    indexer keys: 128 + 4 = 132 bytes for a 128-dim key)."""
    return elements + 4 * -(-elements // block)
