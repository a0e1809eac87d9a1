"""The config fields each family rule reads, and the values each may take.

docs/design.md, rule 7: a value kvpool cannot follow is refused by its name,
never read as something else (`int("abc")` failing with no field named, a head
dim of 64.5 read as 64, a conv kernel of 0 pricing a negative state, a string of
compress ratios read one character at a time). `FAMILY_FIELDS` lists, per family
(`spec.dispatch.family_of`), every field its rule reads, as a dotted path for a
field inside an object (`linear_attn_config.num_heads`), with its domain;
`check_family_fields` checks them all before the rule runs. A rule reading a
field missing from its row fails `tests/test_spec_family_fields.py`, which
records what each rule reads; the same test gives every field bad values.

Relations between fields (an offset below its period, a pattern with one letter
per layer) are checked by the rule that reads them, naming both fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec.validate import MAX_CONFIG_INT, TORCH_DTYPES


def _int(value: Any, low: int) -> bool:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_CONFIG_INT


def _ints(value: Any, low: int, high: int = MAX_CONFIG_INT) -> bool:
    return isinstance(value, list) and all(_int(v, low) and v <= high for v in value)


# The state dtypes kvpool prices (spec/dtypes.py): a name outside them would be read as bf16.
STATE_DTYPES = ("bfloat16", "float16", "half", "float32", "float")

# domain -> (test, what a value must be, in words)
DOMAINS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (lambda v: _int(v, 1), "a positive integer"),
    "count0": (lambda v: _int(v, 0), "a non-negative integer"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "object": (lambda v: isinstance(v, Mapping), "a JSON object"),
    "objects": (lambda v: isinstance(v, list) and all(isinstance(x, Mapping) for x in v), "a list of JSON objects"),
    "names": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "bits": (lambda v: _ints(v, 0, 1), "a list of 0 and 1, one per layer"),
    "counts0": (lambda v: _ints(v, 0), "a list of non-negative integers, one per layer"),
    "layer_numbers": (lambda v: _ints(v, 1), "a list of layer numbers (from 1)"),
    "window_pattern": (
        lambda v: _int(v, 1) or (isinstance(v, str) and bool(v) and set(v) <= {"L", "G"}),
        "a positive integer or a string of L (local) and G (global)",
    ),
    "nemotron_pattern": (
        lambda v: isinstance(v, str) and bool(v) and set(v) <= set("M*-E"),
        "a string of M (Mamba-2), * (attention), - (MLP) and E (MoE), one per layer",
    ),
    "torch_dtype": (
        lambda v: isinstance(v, str) and v.lower().removeprefix("torch.") in TORCH_DTYPES,
        "a torch dtype name such as bfloat16",
    ),
    "state_dtype": (
        lambda v: isinstance(v, str) and v.lower().removeprefix("torch.") in STATE_DTYPES,
        f"one of {', '.join(STATE_DTYPES)}",
    ),
}

# What every family reads (spec/families.py head_dim, kv_heads; the loader).
COMMON = {
    "model_type": "text",
    "num_hidden_layers": "count",
    "num_attention_heads": "count",
    "num_key_value_heads": "count",
    "head_dim": "count",
    "hidden_size": "count",
    "max_position_embeddings": "count",
    "torch_dtype": "torch_dtype",
    "dtype": "torch_dtype",
}
# standard_attention's layer types (spec/families.py layer_types) and Gemma 4's global layers
ATTENTION = {
    **COMMON,
    "layer_types": "names",
    "full_attention_interval": "count",
    "sliding_window": "count",
    "sliding_window_pattern": "window_pattern",
    "use_sliding_window": "flag",
    "max_window_layers": "count0",
    "cache_implementation": "text",
    "attention_chunk_size": "count",
    "no_rope_layers": "bits",
    "no_rope_layer_interval": "count",
    "global_head_dim": "count",
    "num_global_key_value_heads": "count",
}
MLA = {"kv_lora_rank": "count", "qk_rope_head_dim": "count", "index_head_dim": "count"}
MAMBA2 = {f"mamba_{k}": "count" for k in ("n_heads", "n_groups", "d_head", "d_state", "d_conv")}
# Qwen3-Next reads its linear-attention fields at the top level or inside
# `linear_attention`, with or without the `linear_` prefix there.
_LINEAR = ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_dim")
GATED_DELTANET = {
    "linear_attention": "object",
    **{f"linear_{k}": "count" for k in _LINEAR},
    **{f"linear_attention.{k}": "count" for k in _LINEAR},
    **{f"linear_attention.linear_{k}": "count" for k in _LINEAR},
}

FAMILY_FIELDS: dict[str, dict[str, str]] = {
    "attention": ATTENTION,
    "deepseek_v3": {**COMMON, **MLA},
    "deepseek_v32": {**COMMON, **MLA},
    "deepseek_v4": {**COMMON, "compress_ratios": "counts0", "sliding_window": "count", "index_head_dim": "count"},
    # mamba_ssm_dtype: Qwen3.5's recurrent-state dtype (vLLM's Qwen3_5ForConditionalGenerationConfig
    # keeps that state in it); checked, but the state is still priced in the served dtype
    "qwen3_next": {**ATTENTION, **GATED_DELTANET, "mamba_ssm_dtype": "state_dtype"},
    "kimi_linear": {
        **ATTENTION,
        **MLA,
        "linear_attn_config": "object",
        "linear_attn_config.num_heads": "count",
        "linear_attn_config.head_dim": "count",
        "linear_attn_config.short_conv_kernel_size": "count",
        "linear_attn_config.full_attn_layers": "layer_numbers",
        "linear_attn_config.kda_layers": "layer_numbers",
    },
    "mimo_v2_flash": {
        **COMMON,
        "hybrid_layer_pattern": "bits",
        "sliding_window": "count",
        "sliding_window_size": "count",
        "v_head_dim": "count",
        "swa_num_key_value_heads": "count",
        "swa_head_dim": "count",
        "swa_v_head_dim": "count",
    },
    "nemotron-nas": {**COMMON, "block_configs": "objects"},
    "jamba": {
        **COMMON,
        "attn_layer_period": "count",
        "attn_layer_offset": "count0",
        "mamba_expand": "count",
        "mamba_d_conv": "count",
        "mamba_d_state": "count",
    },
    "granitemoehybrid": {**COMMON, "layer_types": "names", **MAMBA2},
    "falcon_h1": {**COMMON, **MAMBA2},
    "nemotron_h": {
        **COMMON,
        "hybrid_override_pattern": "nemotron_pattern",
        "mamba_num_heads": "count",
        "n_groups": "count",
        "mamba_head_dim": "count",
        "ssm_state_size": "count",
        "conv_kernel": "count",
        "mamba_ssm_cache_dtype": "state_dtype",
    },
}


def field_value(config: Mapping[str, Any], path: str) -> Any:
    """The value at dotted `path` in `config` (None when a part is missing or not an object)."""
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def check_family_fields(family: str, config: Mapping[str, Any], where: str) -> None:
    """SpecError naming the field, what it must be and `where` for a value of a
    field `family`'s rule reads that is outside its domain (null: not set)."""
    for path, domain in FAMILY_FIELDS.get(family, COMMON).items():
        value = field_value(config, path)
        test, what = DOMAINS[domain]
        if value is not None and not test(value):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise SpecError(f"{where}: field {path!r} must be {what}, got {shown}")
