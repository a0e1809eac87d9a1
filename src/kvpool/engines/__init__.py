"""engines: what vLLM, SGLang and TensorRT-LLM would allocate and print for a
deployment, and the flags that make them follow a kvpool plan (no engine is
imported)."""

from kvpool.engines import registry, sglang, trtllm, vllm
from kvpool.engines.common import (
    EngineModel,
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    Sizing,
    allocate_with,
)

__all__ = [
    "EngineModel",
    "EngineNotModelledError",
    "EnginePool",
    "EngineReport",
    "Sizing",
    "allocate_with",
    "registry",
    "sglang",
    "trtllm",
    "vllm",
]
