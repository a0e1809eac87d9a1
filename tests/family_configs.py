"""Configs of every family kvpool models (spec/dispatch.py), as the family tests
and the generated bad-field suite (tests/test_spec_family_fields.py) read them:
a published config.json where tests/data/configs has one (SOURCES.md), else the
fields of a published config that shape its cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpool.spec.loader import read_config

CONFIGS = Path(__file__).parent / "data" / "configs"


def jamba_v01() -> dict[str, Any]:
    """The fields of ai21labs/Jamba-v0.1's published config.json that shape its cache."""
    return {
        "model_type": "jamba",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    }


def granite_small(layers: int = 8) -> dict[str, Any]:
    """A Granite-4.0-H-shaped config: attention at layers 3 and 7, Mamba-2 elsewhere."""
    types = ["attention" if i % 4 == 3 else "mamba" for i in range(layers)]
    return {
        "model_type": "granitemoehybrid",
        "hidden_size": 1536,
        "num_hidden_layers": layers,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "layer_types": types,
        "mamba_n_heads": 48,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
    }


def nemotron_small() -> dict[str, Any]:
    """A Nemotron-H-shaped config: M = Mamba-2, * = attention, - = MLP."""
    return {
        "model_type": "nemotron_h",
        "hidden_size": 1024,
        "num_hidden_layers": 7,
        "hybrid_override_pattern": "M-M*-M*",
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "mamba_num_heads": 32,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }


def falcon_h1_small() -> dict[str, Any]:
    """A Falcon-H1-shaped config: attention and a Mamba-2 mixer in every layer."""
    return {
        "model_type": "falcon_h1",
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_n_heads": 24,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }


def published(name: str) -> dict[str, Any]:
    """tests/data/configs/NAME.json with its text_config followed (as the loader reads it)."""
    return read_config(CONFIGS / f"{name}.json")[1]


# family (spec.dispatch.family_of) -> a config of it
FAMILY_CONFIGS = {
    "attention": lambda: published("gemma-3-27b-it"),
    "deepseek_v3": lambda: published("DeepSeek-V3"),
    "deepseek_v32": lambda: published("DeepSeek-V3.2"),
    "deepseek_v4": lambda: published("DeepSeek-V4-Flash"),
    "qwen3_next": lambda: published("Qwen3-Next-80B-A3B-Thinking"),
    "kimi_linear": lambda: published("Kimi-K3"),
    "mimo_v2_flash": lambda: published("MiMo-V2-Flash"),
    "nemotron-nas": lambda: published("Llama-3_3-Nemotron-Super-49B-v1"),
    "nemotron_h": lambda: published("Nemotron-H-56B-Base-8K"),
    "jamba": jamba_v01,
    "granitemoehybrid": granite_small,
    "falcon_h1": falcon_h1_small,
}
