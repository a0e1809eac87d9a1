"""The values transformers' config classes give fields that a `config.json` omits.

docs/design.md, rule 7: a field a config leaves out takes the default transformers gives
it, never a guess of kvpool's. Each entry below is a fact read from the named
transformers class (transformers 5.24.0, `src/transformers/models/<name>/`);
`applied_defaults` reports which of them a given config needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_GEMMA3 = "transformers Gemma3TextConfig (models/gemma3/configuration_gemma3.py)"
_GEMMA2 = "transformers Gemma2Config (models/gemma2/configuration_gemma2.py)"
_MISTRAL = "transformers MistralConfig (models/mistral/configuration_mistral.py)"

# model_type -> (source, {field: default}). Only fields that change what a layer caches
# or the weights' size.
DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3_text": (
        _GEMMA3,
        {
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_size": 2304,
            "sliding_window": 4096,
            "max_position_embeddings": 131072,
            # layer i is global when (i + 1) % 6 == 0 (the class's sliding_window_pattern)
            "sliding_window_pattern": 6,
            # the weights' fields (gemma-3-27b-it's text_config omits them)
            "vocab_size": 262208,
            "intermediate_size": 9216,
            "tie_word_embeddings": True,
        },
    ),
    "gemma2": (
        _GEMMA2,
        {
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_size": 2304,
            "sliding_window": 4096,
            "max_position_embeddings": 8192,
        },
    ),
    "mistral": (
        _MISTRAL,
        {
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "hidden_size": 4096,
            "sliding_window": 4096,
            "max_position_embeddings": 131072,
        },
    ),
    "jamba": (
        "transformers JambaConfig (models/jamba/configuration_jamba.py)",
        {
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "hidden_size": 4096,
            "max_position_embeddings": 262144,
            "attn_layer_period": 8,
            "attn_layer_offset": 4,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
        },
    ),
}
# A multimodal wrapper whose text_config names no model_type of its own.
ALIASES = {"gemma3": "gemma3_text"}


def applied_defaults(config: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """{field: (default, source)} for every field `config` omits that its
    family's transformers class defaults (empty for unknown model types)."""
    model_type = str(config.get("model_type") or "")
    entry = DEFAULTS.get(ALIASES.get(model_type, model_type))
    if entry is None:
        return {}
    source, table = entry
    return {k: (v, source) for k, v in table.items() if k not in config}


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with the transformers defaults of its family filled in."""
    out = dict(config)
    out.update({k: v for k, (v, _src) in applied_defaults(config).items()})
    return out
