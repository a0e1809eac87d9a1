"""engines: what vLLM, SGLang and TensorRT-LLM would allocate and print for a
deployment, and the flags that make them follow a kvpool plan (no engine is
imported)."""

from kvpool.engines import sglang, trtllm, vllm
from kvpool.engines.common import EngineNotModelledError, EnginePool, EngineReport

__all__ = ["EngineNotModelledError", "EnginePool", "EngineReport", "sglang", "trtllm", "vllm"]
