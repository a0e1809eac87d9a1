"""engines: what vLLM, SGLang and TensorRT-LLM would allocate and print for a
deployment, and the flags that make them follow a kvpool plan (no engine is
imported). The engines' modules load on first use (`kvpool simulate` of
kvpool's own policies needs none: `registry`)."""

import importlib
from typing import TYPE_CHECKING, Any

from kvpool.engines.common import (
    EngineModel,
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    Sizing,
    allocate_with,
)

if TYPE_CHECKING:
    from kvpool.engines import registry, sglang, trtllm, vllm

MODULES = ("registry", "sglang", "trtllm", "vllm")


def __getattr__(name: str) -> Any:
    """`engines.vllm` and the other modules of `MODULES`, imported on first use."""
    if name in MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
