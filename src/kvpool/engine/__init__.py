"""engine: the reference PyTorch engine (needs the `engine` extra: torch,
transformers, safetensors). Importing it imports torch.

`Engine(model, plan, ...)` runs continuous batching over kvpool's manager and
scheduler; `load_folder(dir)` / `tiny_model(arch)` give it a `DecoderLM`."""

from kvpool.engine.arch import ArchConfig, EngineError, StalePageError
from kvpool.engine.drafter import NgramDrafter
from kvpool.engine.kv_store import KVStore
from kvpool.engine.model import DecoderLM
from kvpool.engine.runner import Engine, EngineStats, Output
from kvpool.engine.weights import from_state_dict, load_folder, save_folder, tiny_config, tiny_model

__all__ = [
    "ArchConfig", "DecoderLM", "Engine", "EngineError", "EngineStats", "KVStore", "NgramDrafter",
    "Output", "StalePageError", "from_state_dict", "load_folder", "save_folder", "tiny_config",
    "tiny_model",
]
