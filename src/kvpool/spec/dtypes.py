"""KV storage dtypes and the exact bytes of one stored row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec.quant import declared_kv_dtype, declares_modelopt_kv

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


def served_dtype(config: Mapping[str, Any]) -> str:
    """The dtype an engine computes a checkpoint in: its own, except that float32
    checkpoints are served in bf16 (vLLM `--dtype auto`, vllm/config/model.py
    `_resolve_auto_dtype`: "Downcast for float32 models" to the platform's first
    supported dtype, bf16 from compute capability 8.0, platforms/cuda.py)."""
    dtype = model_dtype(config)
    return "bf16" if dtype == "fp32" else dtype


def auto_kv_dtype(config: Mapping[str, Any]) -> tuple[str, str | None]:
    """(dtype, note) that KV dtype `auto` stands for, the engines' convention
    (vLLM `--kv-cache-dtype auto`: "will use model data type"): a KV scheme the
    checkpoint's `quantization_config` declares (`quant.declared_kv_dtype`), else
    `served_dtype`. The note says why when `auto` is not simply the config's dtype."""
    declared = declared_kv_dtype(config)
    if declared is not None:
        dtype, field = declared
        return dtype, f"kv dtype auto = {dtype}: the checkpoint's quantization_config declares it ({field})"
    if model_dtype(config) == "fp32":
        return "bf16", "kv dtype auto = bf16: the checkpoint is float32, which engines serve in bf16"
    return served_dtype(config), None


def engine_auto_dtype(config: Mapping[str, Any]) -> str | None:
    """What vLLM's `--kv-cache-dtype auto` resolves to for `config`: launch lines
    say `auto` when the planned dtype equals it, else name the dtype. vLLM takes
    `auto` from the quantization config only for ModelOpt checkpoints
    (vllm/utils/torch_utils.py `resolve_kv_cache_dtype_string`); a compressed-tensors
    `kv_cache_scheme` is used when fp8 is asked for, so there `auto` is the served
    dtype. None when the ModelOpt scheme is one kvpool cannot store."""
    if not declares_modelopt_kv(config):
        return served_dtype(config)
    try:
        return auto_kv_dtype(config)[0]
    except SpecError:
        return None


def resolve_kv_dtype(kv_dtype: str, config: Mapping[str, Any]) -> str:
    """`auto` becomes `auto_kv_dtype(config)`; anything else must be a known KV dtype."""
    return resolve_kv_dtype_noted(kv_dtype, config)[0]


def resolve_kv_dtype_noted(kv_dtype: str, config: Mapping[str, Any]) -> tuple[str, str | None]:
    """(dtype, note): like `resolve_kv_dtype`, plus the note of `auto_kv_dtype`
    (None for an explicit dtype)."""
    name = str(kv_dtype).lower()
    if name not in KV_DTYPES:
        raise SpecError(f"unsupported kv dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
    return auto_kv_dtype(config) if name == "auto" else (name, None)


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
