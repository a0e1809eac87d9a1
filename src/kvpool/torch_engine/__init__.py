"""engine: the reference PyTorch engine (needs the `engine` extra: torch,
transformers, safetensors). Importing a name from it imports torch;
`kvpool.torch_engine.names` (the architectures) does not.

`Engine(model, plan, ...)` runs continuous batching over kvpool's manager and
scheduler; `load_folder(dir)` / `tiny_model(arch)` give it a `DecoderLM`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

_WHERE = {
    "ArchConfig": "kvpool.torch_engine.arch",
    "EngineError": "kvpool.torch_engine.arch",
    "StalePageError": "kvpool.torch_engine.arch",
    "NgramDrafter": "kvpool.torch_engine.drafter",
    "KVStore": "kvpool.torch_engine.kv_store",
    "DecoderLM": "kvpool.torch_engine.model",
    "Engine": "kvpool.torch_engine.runner",
    "EngineStats": "kvpool.torch_engine.runner",
    "Output": "kvpool.torch_engine.runner",
    "from_state_dict": "kvpool.torch_engine.weights",
    "load_folder": "kvpool.torch_engine.weights",
    "save_folder": "kvpool.torch_engine.weights",
    "tiny_config": "kvpool.torch_engine.weights",
    "tiny_model": "kvpool.torch_engine.weights",
}


def __getattr__(name: str) -> Any:
    # torch loads on first use, so `kvpool.torch_engine.names` stays cheap for the CLI
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
