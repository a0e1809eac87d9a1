"""Refuse config values no engine could load: each error names the field and the file.

docs/design.md, rule 7: a value kvpool cannot follow is an error, never a guess
(`num_key_value_heads: 0` read as "all heads", `head_dim: 64.5` as 64, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.errors import SpecError

# Counts that must be positive integers when present (null means "not set").
POSITIVE_INTS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "sliding_window",
    "sliding_window_pattern",
    "attention_chunk_size",
    "max_position_embeddings",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_head_dim",
    "full_attention_interval",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "no_rope_layer_interval",
    "global_head_dim",
    "num_global_key_value_heads",
    "attn_layer_period",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_num_heads",
    "mamba_head_dim",
    "n_groups",
    "ssm_state_size",
    "conv_kernel",
)
NON_NEGATIVE_INTS = ("max_window_layers", "attn_layer_offset")
# Fields each model_type cannot be planned without (beyond the common ones).
REQUIRED = {
    "deepseek_v3": ("kv_lora_rank", "qk_rope_head_dim"),
    "deepseek_v32": ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"),
    "qwen3_next": (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ),
}

# Families whose layers keep state kvpool does not model yet (Mamba / Mamba-2 /
# other recurrent mixers beside attention): refused by name, never planned as
# plain attention (docs/design.md, rule 7).
UNMODELLED = {
    "bamba": "Bamba (attention + Mamba-2 layers)",
    "zamba": "Zamba (Mamba + shared attention)",
    "zamba2": "Zamba2 (Mamba-2 + shared attention)",
    "mamba": "Mamba (state-space only)",
    "mamba2": "Mamba-2 (state-space only)",
    "falcon_mamba": "Falcon-Mamba (state-space only)",
    "recurrent_gemma": "RecurrentGemma (RG-LRU + local attention)",
    "rwkv": "RWKV (recurrent)",
    "lfm2": "LFM2 (short convolutions + attention)",
    "minimax": "MiniMax (lightning attention + softmax attention)",
    "minimax_m3": "MiniMax-M3 (block-sparse attention with its own index keys)",
    "minimax_m3_vl_text": "MiniMax-M3 (block-sparse attention with its own index keys)",
}


# The dtype names a config's torch_dtype / dtype may hold (torch's own names and
# aliases, and transformers' "auto"); anything else is a typo kvpool would read as bf16.
TORCH_DTYPES = frozenset(
    [
        "auto",
        "bfloat16",
        "float16",
        "half",
        "float32",
        "float",
        "float64",
        "double",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "bool",
    ]
)

MAX_CONFIG_INT = 2**31 - 1
# Tighter bounds where kvpool walks the count one by one (the deepest published
# decoder has a few hundred layers).
MAX_FIELD = {"num_hidden_layers": 10_000}


def _int(value: Any, field: str, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{where}: malformed field {field!r}: must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise SpecError(f"{where}: malformed field {field!r}: must be an integer, got {value!r}")
    if value < low:
        what = "positive" if low == 1 else "non-negative"
        raise SpecError(f"{where}: field {field!r} must be {what}, got {value!r}")
    high = MAX_FIELD.get(field, MAX_CONFIG_INT)  # past 2**31 - 1 sizes would overflow int64 arithmetic
    if value > high:
        raise SpecError(f"{where}: field {field!r} is implausibly large ({value!r} > {high:,})")
    return int(value)


def check_text_config(config: Mapping[str, Any], where: str) -> None:
    """A `text_config` that is present must be an object."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise SpecError(f"{where}: field 'text_config' must be a JSON object, got {text!r}")


def validate_config(config: Mapping[str, Any], where: str) -> None:
    """Raise `SpecError` naming the field and `where` (the file or preset) for a
    value that cannot describe a model (the first of the checks below, in order)."""
    model_type = str(config.get("model_type") or "")
    check_modelled(model_type, where)
    ints = checked_ints(config, where)
    check_heads(ints, where)
    check_dtypes(config, where)
    check_required(config, model_type, where)
    check_layer_types(config, ints.get("num_hidden_layers"), where)


def check_modelled(model_type: str, where: str) -> None:
    """A family kvpool cannot model yet is refused by name."""
    if model_type in UNMODELLED:
        raise SpecError(
            f"{where}: model_type {model_type!r} is {UNMODELLED[model_type]}, which kvpool "
            "cannot model yet; it is refused rather than planned as plain attention"
        )


def checked_ints(config: Mapping[str, Any], where: str) -> dict[str, int]:
    """The counts the config sets (`POSITIVE_INTS`, `NON_NEGATIVE_INTS`), each checked."""
    ints = {}
    for field in POSITIVE_INTS:
        if field == "sliding_window_pattern" and isinstance(config.get(field), str):
            # EXAONE 4 spells the pattern as letters, "LLLG": L local, G global
            if not config[field] or set(config[field]) - {"L", "G"}:
                raise SpecError(f"{where}: field {field!r} must be a positive integer or a string of L and G")
            continue
        if config.get(field) is not None:
            ints[field] = _int(config[field], field, where, 1)
    for field in NON_NEGATIVE_INTS:
        if config.get(field) is not None:
            ints[field] = _int(config[field], field, where, 0)
    return ints


def check_heads(ints: Mapping[str, int], where: str) -> None:
    """The KV heads divide the query heads (GQA groups of equal size)."""
    q, kv = ints.get("num_attention_heads"), ints.get("num_key_value_heads")
    if q and kv and q % kv:
        raise SpecError(f"{where}: field 'num_key_value_heads' ({kv}) must divide num_attention_heads ({q})")


def check_dtypes(config: Mapping[str, Any], where: str) -> None:
    """`torch_dtype` and `dtype`, when set, name a torch dtype."""
    for field in ("torch_dtype", "dtype"):
        value = config.get(field)
        if value is not None and not isinstance(value, str):
            raise SpecError(f"{where}: field {field!r} must be a string such as 'bfloat16', got {value!r}")
        if isinstance(value, str) and value.lower().removeprefix("torch.") not in TORCH_DTYPES:
            raise SpecError(
                f"{where}: field {field!r} is {value!r}, not a torch dtype (e.g. bfloat16, float16, float32)"
            )


def check_required(config: Mapping[str, Any], model_type: str, where: str) -> None:
    """The fields `model_type` cannot be planned without (`REQUIRED`; a nested
    `linear_attention` object stands for Qwen3-Next's linear fields)."""
    for field in REQUIRED.get(model_type, ()):
        if config.get(field) is None and not isinstance(config.get("linear_attention"), Mapping):
            raise SpecError(f"{where}: model_type {model_type!r} needs field {field!r}, which the config lacks")


def check_layer_types(config: Mapping[str, Any], layers: int | None, where: str) -> None:
    """`layer_types`, when set, is a list of strings, one per decoder layer
    (transformers' layer_types); more entries or none is a broken config."""
    types = config.get("layer_types")
    if types is None:
        return
    if not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise SpecError(f"{where}: field 'layer_types' must be a list of strings")
    if not types or (layers is not None and len(types) > layers):
        raise SpecError(
            f"{where}: field 'layer_types' has {len(types)} entries for {layers} layers (num_hidden_layers); "
            "it needs one per layer"
        )
