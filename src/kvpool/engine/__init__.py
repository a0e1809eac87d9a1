"""engine: the reference PyTorch engine (needs the `engine` extra: torch,
transformers, safetensors). Importing a name from it imports torch;
`kvpool.engine.names` (the architectures) does not.

`Engine(model, plan, ...)` runs continuous batching over kvpool's manager and
scheduler; `load_folder(dir)` / `tiny_model(arch)` give it a `DecoderLM`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvpool.engine.names import ARCHS

if TYPE_CHECKING:
    from kvpool.engine.arch import ArchConfig, EngineError, StalePageError
    from kvpool.engine.drafter import NgramDrafter
    from kvpool.engine.kv_store import KVStore
    from kvpool.engine.model import DecoderLM
    from kvpool.engine.runner import Engine, EngineStats, Output
    from kvpool.engine.weights import (
        from_state_dict,
        load_folder,
        save_folder,
        tiny_config,
        tiny_model,
    )

_WHERE = {
    "ArchConfig": "kvpool.engine.arch",
    "EngineError": "kvpool.engine.arch",
    "StalePageError": "kvpool.engine.arch",
    "NgramDrafter": "kvpool.engine.drafter",
    "KVStore": "kvpool.engine.kv_store",
    "DecoderLM": "kvpool.engine.model",
    "Engine": "kvpool.engine.runner",
    "EngineStats": "kvpool.engine.runner",
    "Output": "kvpool.engine.runner",
    "from_state_dict": "kvpool.engine.weights",
    "load_folder": "kvpool.engine.weights",
    "save_folder": "kvpool.engine.weights",
    "tiny_config": "kvpool.engine.weights",
    "tiny_model": "kvpool.engine.weights",
}


def __getattr__(name: str) -> Any:
    # torch loads on first use, so `kvpool.engine.names` stays cheap for the CLI
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
