"""engine: the reference PyTorch engine (needs the `engine` extra: torch,
transformers, safetensors). Importing a name from it imports torch;
`kvpool.torch_engine.names` (the architectures) does not.

`Engine(model, plan, ...)` runs continuous batching over kvpool's manager and
scheduler; `load_folder(dir)` / `tiny_model(arch)` give it a `DecoderLM`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.lazy import lazy_names
from kvpool.torch_engine.names import ARCHS

if TYPE_CHECKING:
    from kvpool.torch_engine.arch import ArchConfig, EngineError, StalePageError
    from kvpool.torch_engine.drafter import NgramDrafter
    from kvpool.torch_engine.kv_store import KVStore
    from kvpool.torch_engine.model import DecoderLM
    from kvpool.torch_engine.runner import Engine, EngineStats, Output
    from kvpool.torch_engine.weights import (
        from_state_dict,
        load_folder,
        save_folder,
        tiny_config,
        tiny_model,
    )

# torch loads on first use, so `kvpool.torch_engine.names` stays cheap for the CLI
__getattr__ = lazy_names(
    __name__,
    {
        "kvpool.torch_engine.arch": ("ArchConfig", "EngineError", "StalePageError"),
        "kvpool.torch_engine.drafter": ("NgramDrafter",),
        "kvpool.torch_engine.kv_store": ("KVStore",),
        "kvpool.torch_engine.model": ("DecoderLM",),
        "kvpool.torch_engine.runner": ("Engine", "EngineStats", "Output"),
        "kvpool.torch_engine.weights": ("from_state_dict", "load_folder", "save_folder", "tiny_config", "tiny_model"),
    },
)


__all__ = [
    "ARCHS",
    "ArchConfig",
    "DecoderLM",
    "Engine",
    "EngineError",
    "EngineStats",
    "KVStore",
    "NgramDrafter",
    "Output",
    "StalePageError",
    "from_state_dict",
    "load_folder",
    "save_folder",
    "tiny_config",
    "tiny_model",
]
