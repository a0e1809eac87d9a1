"""Factories for the weights tests: tiny configs of each family kvpool counts,
safetensors folders written with the `safetensors` package, and raw files with
hand-made (possibly malformed) headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

TINY: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 128,
}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 16}
FAMILY_EXTRAS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False},
    "llama_biased": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"tie_word_embeddings": True},
    "gemma2": {},
    "gemma3_text": {},
    "olmo2": {},
    "phi3": {"head_dim": 8, "pad_token_id": 0},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {**_MOE, "num_experts": 4, "decoder_sparse_step": 1, "mlp_only_layers": [1]},
    "qwen2_moe": {**_MOE, "num_experts": 4, "shared_expert_intermediate_size": 24},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": ["sliding_attention"] * 3},
    "deepseek_v3": {
        **_MOE,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_group": 1,
        "topk_group": 1,
    },
    "deepseek_v2": {
        **_MOE,
        "n_routed_experts": 4,
        "n_shared_experts": 2,
        "first_k_dense_replace": 1,
        "q_lora_rank": None,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_group": 1,
        "topk_group": 1,
    },
}


def tiny_config(name: str) -> dict[str, Any]:
    """A tiny config of family `name` (a key of FAMILY_EXTRAS)."""
    extras = dict(FAMILY_EXTRAS[name])
    return {"model_type": extras.pop("model_type", name), **TINY, **extras}


def save_tensors(path: Path, tensors: dict[str, npt.NDArray[Any]]) -> None:
    """Write `tensors` to `path` with the safetensors package itself."""
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))


def random_tensors(seed: int, shapes: dict[str, tuple[int, ...]], dtype: str) -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}


def raw_file(path: Path, header: bytes, *, length: int | None = None, data: bytes = b"") -> Path:
    """A file of an 8-byte little-endian length (`len(header)` unless given),
    `header` and `data`: the raw safetensors layout, for malformed cases."""
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + data)
    return path


def header_json(entries: dict[str, Any]) -> bytes:
    return json.dumps(entries).encode()


def write_config(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
