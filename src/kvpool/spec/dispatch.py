"""`family_of`: which family rule reads a config (by `model_type` where the
fields alone are ambiguous, else by the fields it has)."""

from __future__ import annotations

from collections.abc import Callable

from kvpool.spec.families import (
    Config,
    Context,
    LayerCache,
    deepseek_v4,
    gated_deltanet,
    kimi_linear,
    mla,
    standard_attention,
)
from kvpool.spec.layerwise import mimo_v2_flash, nemotron_nas
from kvpool.spec.mamba import falcon_h1, granite_hybrid, jamba, nemotron_h

Rule = Callable[[Config, Context], list[LayerCache]]

# families the fields alone do not identify (hybrid attention + state-space,
# per-layer head counts), named by their model_type
BY_MODEL_TYPE: dict[str, Rule] = {
    "jamba": jamba,
    "granitemoehybrid": granite_hybrid,
    "nemotron_h": nemotron_h,
    "falcon_h1": falcon_h1,
    "kimi_linear": kimi_linear,
    "mimo_v2_flash": mimo_v2_flash,
    "nemotron-nas": nemotron_nas,
}


def family_of(config: Config) -> tuple[str, Rule]:
    """(family name, rule) for a config."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in BY_MODEL_TYPE:
        return model_type, BY_MODEL_TYPE[model_type]
    if config.get("compress_ratios"):
        return "deepseek_v4", deepseek_v4
    if config.get("kv_lora_rank"):
        return ("deepseek_v32" if config.get("index_head_dim") else "deepseek_v3"), mla
    types = config.get("layer_types") or []
    if "linear_attention" in types or any(
        config.get(k) for k in ("linear_attention", "full_attention_interval", "linear_num_value_heads")
    ):
        return "qwen3_next", gated_deltanet
    return "attention", standard_attention
