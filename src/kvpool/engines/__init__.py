"""engines: what vLLM, SGLang and TensorRT-LLM would allocate and print for a
deployment, and the flags that make them follow a kvpool plan (no engine is
imported). The engines' modules load on first use (`kvpool simulate` of
kvpool's own policies needs none: `registry`)."""

from typing import TYPE_CHECKING

from kvpool.engines.common import (
    EngineModel,
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    Sizing,
    allocate_with,
)
from kvpool.lazy import lazy_names

if TYPE_CHECKING:
    from kvpool.engines import registry, sglang, trtllm, vllm

MODULES = ("registry", "sglang", "trtllm", "vllm")
__getattr__ = lazy_names(__name__, {}, MODULES)  # `engines.vllm` and the others, imported on first use


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
