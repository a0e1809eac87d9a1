"""`load_model_spec`: a preset name, a config.json path or a dict -> `ModelSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpool import presets
from kvpool.errors import SpecError
from kvpool.models import ModelSource, resolve_model
from kvpool.spec.defaults import with_defaults
from kvpool.spec.dispatch import family_of
from kvpool.spec.dtypes import resolve_kv_dtype_noted
from kvpool.spec.families import Context, LayerCache
from kvpool.spec.fields import check_family_fields
from kvpool.spec.groups import LayerGroup, ModelSpec
from kvpool.spec.jsonfile import read_json
from kvpool.spec.kinds import kind_rule
from kvpool.spec.quant import with_sidecar_quant_config
from kvpool.spec.stages import busiest_stage
from kvpool.spec.validate import check_text_config, validate_config
from kvpool.units import is_positive_int

DEFAULT_TOKENS_PER_BLOCK = 32
# vLLM's --mamba-ssm-cache-dtype values (MambaDType) -> kvpool's dtype names; auto: the family's default
SSM_DTYPES: dict[str, str | None] = {"auto": None, "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# DeepSeek-V4 keeps ratio-128 compressed rows, so its pages must cover 128 positions.
FAMILY_TOKENS_PER_BLOCK = {"deepseek_v4": 128}


def read_config(source: str | Path | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, config dict) from a preset name, a path to a config.json (or its
    folder), or a dict; a nested `text_config` is followed."""
    name, _where, config = read_config_from(source)
    return name, config


def read_config_from(source: str | Path | Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(name, where, config dict): like `read_config`, plus `where` (the file,
    preset or dict it came from) for error messages."""
    name, where, config, _origin = read_model_config(source)
    return name, where, config


def read_model_config(
    source: str | Path | Mapping[str, Any],
) -> tuple[str, str, dict[str, Any], ModelSource | None]:
    """(name, where, config dict, origin): like `read_config_from`, plus where a
    MODEL came from (`kvpool.models.resolve_model`: preset, path or Hugging Face
    id; None for a dict). A hub id may read and fill the hub cache (see
    `resolve_model`). Sidecar files (hf_quant_config.json) are read from the
    folder the config lies in, a hub snapshot's included."""
    origin: ModelSource | None = None
    if isinstance(source, Mapping):
        name, config = str(source.get("_name_or_path") or source.get("model_type") or "model"), dict(source)
        where = f"config {name}"
    else:
        origin = resolve_model(source)
        if origin.kind == "preset":  # origin.name: a preset may stand in for a hub id (ModelSource.fallback)
            name, config = origin.name, presets.load_model_config(origin.name)
            where = f"preset {name}"
        else:
            path = origin.config_path
            config = read_json(path)
            if origin.repo_id:
                name, where = origin.repo_id, f"{origin.repo_id} ({path})"
            else:
                name, where = path.parent.name if path.name == "config.json" else path.stem, str(path)
            config = with_sidecar_quant_config(config, origin.folder or path.parent)
    if not isinstance(config, dict):
        raise SpecError(f"config of {name} must be a JSON object")
    check_text_config(config, where)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        config = merged
    return name, where, config, origin


def build_groups(caches: list[LayerCache], tokens_per_block: int) -> tuple[LayerGroup, ...]:
    """Merge per-layer caches into pool groups: same tag, life cycle and bytes
    per row. State groups merge by tag alone: one slot holds every layer's state."""
    merged: dict[tuple[Any, ...], list[LayerCache]] = {}
    for c in caches:
        per_request = kind_rule(c.kind).per_request
        key = (c.tag, c.kind) if per_request else (c.tag, c.kind, c.window, c.ratio, c.row_bytes)
        merged.setdefault(key, []).append(c)
    tags = [key[0] for key in merged]
    groups = []
    for members in merged.values():
        first = members[0]
        name = first.tag
        if tags.count(first.tag) > 1:  # e.g. two sliding windows: sliding_512, sliding_4096
            name = f"{first.tag}_{first.window or first.ratio or first.row_bytes}"
        groups.append(
            LayerGroup(
                name=name,
                kind=first.kind,
                layers=tuple(c.layer for c in members),
                tokens_per_block=tokens_per_block,
                row_bytes=sum(c.row_bytes for c in members),
                state_bytes=sum(c.state_bytes for c in members),
                window=first.window,
                ratio=first.ratio,
                buffers=first.buffers if all(c.buffers == first.buffers for c in members) else (),
            )
        )
    return tuple(groups)


def _check_sizes(tp_size: int, pp_size: int, tokens_per_block: int | None, max_seq_len: int | None) -> None:
    checked = (
        ("tp_size", tp_size),
        ("pp_size", pp_size),
        ("tokens_per_block", tokens_per_block),
        ("max_seq_len", max_seq_len),
    )
    for arg, value in checked:
        if value is not None and not is_positive_int(value):
            raise SpecError(f"{arg} must be a positive integer, got {value!r}")


def check_tp_divides_heads(config: Mapping[str, Any], tp_size: int) -> None:
    """SpecError when `tp_size` does not split the config's attention heads evenly:
    vLLM 0.32 refuses it (`ModelConfig.verify_with_parallel_config`: "Total number
    of attention heads (28) must be divisible by tensor parallel size (8)") and
    SGLang 0.5.23's attention layers assert it (`models/qwen2.py`). KV heads fewer
    than `tp_size` are replicated there, so only the query heads are checked."""
    text = config.get("text_config")
    heads = (text if isinstance(text, Mapping) and "num_attention_heads" in text else config).get("num_attention_heads")
    if tp_size > 1 and isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 and heads % tp_size:
        raise SpecError(
            f"tensor-parallel size {tp_size} does not divide the model's {heads} attention heads "
            f"(vLLM and SGLang refuse it); use a tensor-parallel size that divides {heads}"
        )


def load_model_spec(
    source: str | Path | Mapping[str, Any],
    *,
    kv_dtype: str = "auto",
    tp_size: int = 1,
    pp_size: int = 1,
    tokens_per_block: int | None = None,
    max_seq_len: int | None = None,
    ssm_dtype: str = "auto",
) -> ModelSpec:
    """The KV layout of a model.

    `source` is a bundled preset name (`kvpool models`), a path to a
    `config.json` (or its folder), a Hugging Face id `org/name[@revision]` (read
    from the local hub cache first, see docs/models.md), or a config dict;
    `ModelSpec.source` records which. `kv_dtype` is `auto` (what
    engines serve: `spec.dtypes.auto_kv_dtype`; `ModelSpec.kv_dtype_note` says
    why when that is not the config's dtype), `bf16`, `fp16`, `fp32`, `fp8` or
    `nvfp4`. Under tensor parallelism (`tp_size`) the spec is one rank's share; under pipeline
    parallelism (`pp_size`) it holds the layers of the stage that needs the most KV bytes (`pp_stage`). `tokens_per_block`
    defaults to 32 (128 for DeepSeek-V4). A sliding window of at least
    `max_seq_len` (default: the config's `max_position_embeddings`) is full
    attention. `ssm_dtype` keeps the recurrent state's SSM part of Mamba layers in
    that dtype (`auto`: the family's default; vLLM's --mamba-ssm-cache-dtype).
    Raises `SpecError` (a `KvpoolError`) on anything it cannot read,
    and on a `tp_size` that does not divide the attention heads (`check_tp_divides_heads`).
    """
    _check_sizes(tp_size, pp_size, tokens_per_block, max_seq_len)
    if not isinstance(source, str | Path | Mapping):
        raise SpecError(
            f"a model is a preset name, a path, a Hugging Face id or a config dict, not {type(source).__name__}"
        )
    return spec_from_read(
        read_model_config(source),
        kv_dtype=kv_dtype,
        tp_size=tp_size,
        pp_size=pp_size,
        tokens_per_block=tokens_per_block,
        max_seq_len=max_seq_len,
        ssm_dtype=ssm_dtype,
    )


def spec_from_read(
    read: tuple[str, str, dict[str, Any], ModelSource | None],
    *,
    kv_dtype: str = "auto",
    tp_size: int = 1,
    pp_size: int = 1,
    tokens_per_block: int | None = None,
    max_seq_len: int | None = None,
    ssm_dtype: str = "auto",
) -> ModelSpec:
    """`load_model_spec` on what `read_model_config` returned, so that a caller who
    needs the raw config first (the CLI's max_seq_len default) reads it once."""
    _check_sizes(tp_size, pp_size, tokens_per_block, max_seq_len)
    name, where, config, origin = read
    validate_config(config, where)
    check_tp_divides_heads(config, tp_size)
    config = with_defaults(config)
    family, rule = family_of(config)
    check_family_fields(family, config, where)
    tpb = tokens_per_block or FAMILY_TOKENS_PER_BLOCK.get(family, DEFAULT_TOKENS_PER_BLOCK)
    dtype, dtype_note = resolve_kv_dtype_noted(kv_dtype, config)
    max_pos = config.get("max_position_embeddings")
    if ssm_dtype not in SSM_DTYPES:
        raise SpecError(f"ssm_dtype {ssm_dtype!r}: use one of {', '.join(SSM_DTYPES)}")
    ctx = Context(kv_dtype=dtype, tp_size=tp_size, max_seq_len=max_seq_len or max_pos, ssm_dtype=SSM_DTYPES[ssm_dtype])
    try:
        caches = rule(config, ctx)
        num_layers = int(config.get("num_hidden_layers") or 0)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        if isinstance(e, SpecError):  # the rule's own check, naming the field: and the file
            raise SpecError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None
        raise SpecError(f"config of {name} has a malformed field: {e}") from None
    stage = None
    if pp_size > 1:
        index, caches = busiest_stage(caches, num_layers, pp_size, lambda c: build_groups(c, tpb))
        stage = (index, pp_size)
    return ModelSpec(
        name=name,
        family=family,
        groups=build_groups(caches, tpb),
        tokens_per_block=tpb,
        kv_dtype=dtype,
        tp_size=tp_size,
        num_layers=num_layers,
        max_position_embeddings=int(max_pos) if max_pos else None,
        config=config,
        kv_dtype_note=dtype_note,
        source=origin,
        pp_stage=stage,
        ssm_dtype=ssm_dtype,
    )
