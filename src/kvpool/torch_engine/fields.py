"""Every field of the transformers config classes the engine accepts, in one
of three lists, so that no field can change the math unnoticed:

- `IMPLEMENTED`: read by `ArchConfig` (or by `kvpool.spec`'s layer types) and
  covered by the parity tests;
- `IRRELEVANT`: no effect on greedy inference (training, bookkeeping, output
  switches), or ignored by transformers itself (Gemma 3 reads
  `attn_logit_softcapping` but never applies it);
- `REFUSED`: supported only at the value given; any other value raises
  `EngineError` naming the field (exit 2 in the CLI).

tests/test_engine_fields.py walks each config class's fields against these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.torch_engine.errors import EngineError

_BOOKKEEPING = frozenset(
    {
        "_name_or_path",
        "architectures",
        "attention_dropout",
        "bos_token_id",
        "chunk_size_feed_forward",
        "dtype",
        "id2label",
        "initializer_range",
        "is_encoder_decoder",
        "label2id",
        "model_type",
        "output_attentions",
        "output_hidden_states",
        "pad_token_id",
        "problem_type",
        "return_dict",
        "transformers_version",
        "use_cache",
        "pretraining_tp",  # transformers 5 no longer reads it
    }
)
_CORE = frozenset(
    {
        "eos_token_id",
        "hidden_size",
        "intermediate_size",
        "max_position_embeddings",
        "num_attention_heads",
        "num_hidden_layers",
        "num_key_value_heads",
        "rms_norm_eps",
        "rope_parameters",
        "tie_word_embeddings",
        "vocab_size",
        "head_dim",
    }
)
_QWEN_WINDOWS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
_GEMMA = frozenset(
    {
        "hidden_activation",
        "query_pre_attn_scalar",
        "final_logit_softcapping",
        "sliding_window",
        "layer_types",
        "attention_bias",
    }
)

IMPLEMENTED: dict[str, frozenset[str]] = {
    "llama": _CORE | {"hidden_act", "attention_bias", "mlp_bias"},
    "mistral": _CORE | {"hidden_act", "sliding_window"},
    "qwen2": _CORE | {"hidden_act"} | _QWEN_WINDOWS,
    "qwen3": _CORE | {"hidden_act", "attention_bias"} | _QWEN_WINDOWS,
    "gemma2": _CORE | _GEMMA | {"attn_logit_softcapping"},
    "gemma3_text": _CORE | _GEMMA | {"_sliding_window_pattern"},
    "mixtral": _CORE | {"hidden_act", "sliding_window", "num_local_experts", "num_experts_per_tok"},
    "qwen3_moe": _CORE
    | {"hidden_act", "attention_bias", "sliding_window", "use_sliding_window"}
    | {"num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"}
    | {"decoder_sparse_step", "mlp_only_layers"},
}
IRRELEVANT: dict[str, frozenset[str]] = {
    **{t: _BOOKKEEPING for t in IMPLEMENTED},
    "gemma3_text": _BOOKKEEPING | {"attn_logit_softcapping"},
    "mixtral": _BOOKKEEPING | {"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"},
    "qwen3_moe": _BOOKKEEPING | {"output_router_logits", "router_aux_loss_coef"},
}
# field -> the one value the engine runs
REFUSED: dict[str, dict[str, Any]] = {
    **{t: {} for t in IMPLEMENTED},
    "gemma2": {"use_bidirectional_attention": False},
    "gemma3_text": {"use_bidirectional_attention": False},
}


def check_fields(config: Mapping[str, Any]) -> None:
    """Raise `EngineError` naming the first refused field set to a value the
    engine does not run (a missing or null field is its default)."""
    model_type = str(config.get("model_type", ""))
    for name, supported in REFUSED.get(model_type, {}).items():
        value = config.get(name)
        if value is not None and value != supported:
            raise EngineError(
                f"config field {name}={value!r} is not supported by the reference engine "
                f"for {model_type} (only {supported!r})"
            )
