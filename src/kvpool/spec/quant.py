"""The KV cache dtype a checkpoint's `quantization_config` declares.

A checkpoint calibrated for a quantized KV cache says so in its config.json, and
kvpool's KV dtype `auto` then plans that dtype:

- ModelOpt (`quant_method: modelopt`, NVIDIA TensorRT Model Optimizer) writes
  `kv_cache_quant_algo` ("FP8", "NVFP4"), or in newer releases `kv_cache_scheme`,
  either the same string or a compressed-tensors style object. vLLM reads both for
  `--kv-cache-dtype auto` (vllm/utils/torch_utils.py `get_kv_cache_quant_algo_string`,
  used by `resolve_kv_cache_dtype_string`): an object `{"num_bits": 8, "type":
  "float"}` is FP8.
- compressed-tensors (llm-compressor) writes `kv_cache_scheme`, an object of the
  same shape (`num_bits`, `type`, `strategy`, ...), or null when the KV cache is
  not quantized. Its calibrated FP8 scales are what the checkpoint is meant to be
  served with, but vLLM uses them only when fp8 is asked for (its `auto` stays the
  model dtype), so launch lines name the dtype (`dtypes.engine_auto_dtype`).

Only the fields that fix the stored element width are read. A scheme kvpool has no
dtype for (an INT8 KV cache, 4-bit without NVFP4's 16-value blocks, an unknown
algorithm) is refused by name rather than planned at the wrong width.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec.jsonfile import read_json

# ModelOpt's algorithm names (lower-cased) -> kvpool KV dtype.
ALGOS = {"fp8": "fp8", "nvfp4": "nvfp4"}
KV_FIELDS = ("kv_cache_scheme", "kv_cache_quant_algo")


def _scheme_dtype(scheme: Mapping[str, Any], field: str) -> str:
    bits, kind = scheme.get("num_bits"), str(scheme.get("type") or "").lower()
    if bits == 8 and kind == "float":
        return "fp8"
    if bits == 4 and kind == "float" and scheme.get("group_size") in (None, 16):
        return "nvfp4"  # NVFP4: 4-bit floats with one FP8 scale per 16 values
    raise SpecError(
        f"quantization_config.{field} {dict(scheme)!r} declares a KV cache kvpool cannot store "
        "(it knows 8-bit and NVFP4 floating point); give --kv-dtype explicitly"
    )


def _algo_dtype(algo: str, field: str) -> str:
    dtype = ALGOS.get(algo.strip().lower())
    if dtype is None:
        raise SpecError(
            f"quantization_config.{field} {algo!r} is a KV cache algorithm kvpool cannot store "
            f"(it knows {', '.join(a.upper() for a in ALGOS)}); give --kv-dtype explicitly"
        )
    return dtype


def declared_kv_dtype(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kvpool KV dtype, the field that declared it) from `config`'s
    `quantization_config`, or None when it declares no KV scheme. Raises
    `SpecError` naming the field for a scheme kvpool cannot store."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    # ModelOpt's own hf_quant_config.json nests the fields under "quantization"
    inner = quant.get("quantization")
    places: list[tuple[str, Mapping[str, Any]]] = [("", quant)]
    if isinstance(inner, Mapping):
        places.insert(0, ("quantization.", inner))
    for field in KV_FIELDS:
        for prefix, table in places:
            value, name = table.get(field), prefix + field
            if value is None:
                continue
            if isinstance(value, Mapping):
                return _scheme_dtype(value, name), f"quantization_config.{name}"
            if isinstance(value, str):
                return _algo_dtype(value, name), f"quantization_config.{name}"
            raise SpecError(f"quantization_config.{name} must be an object or a string, got {value!r}")
    return None


def declares_modelopt_kv(config: Mapping[str, Any]) -> bool:
    """Whether `config` is a ModelOpt checkpoint (`quant_method: modelopt`, a
    ModelOpt producer, or hf_quant_config.json's nested `quantization`) whose
    quantization config names a KV scheme."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return False
    inner = quant.get("quantization")
    tables = [quant, inner] if isinstance(inner, Mapping) else [quant]
    if all(t.get(f) is None for t in tables for f in KV_FIELDS):
        return False
    producer = quant.get("producer")
    return (
        str(quant.get("quant_method") or "").startswith("modelopt")
        or (isinstance(producer, Mapping) and producer.get("name") == "modelopt")
        or isinstance(inner, Mapping)
    )


SIDECAR = "hf_quant_config.json"


def with_sidecar_quant_config(config: Any, folder: Path) -> Any:
    """`config` with `quantization_config` read from `folder/hf_quant_config.json`
    when config.json has none: ModelOpt 0.29 and before wrote it beside the config,
    and vLLM reads it there (vllm/transformers_utils/config.py). Reads that one
    file when it exists; anything but a dict config is returned unchanged."""
    path = folder / SIDECAR
    if not isinstance(config, dict) or config.get("quantization_config") is not None or not path.is_file():
        return config
    sidecar = read_json(path, "quantization sidecar")
    if not isinstance(sidecar, dict):
        raise SpecError(f"{path} must be a JSON object")
    return {**config, "quantization_config": sidecar}
