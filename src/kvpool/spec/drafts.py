"""A speculative drafter's KV: its layers as their own groups of the target's spec.

Every drafter that runs beside the target keeps KV for the positions it drafts
from, paged like the target's: a separate draft model (vLLM `--speculative-config
'{"method": "draft_model", ...}'`), an EAGLE / EAGLE-3 head (one or a few decoder
layers) or the model's own multi-token-prediction (MTP) layers. vLLM registers
those layers after the target's, in the same KV cache spec (0.33 marks them
`is_draft`); TensorRT-LLM's one-model drafters add them to the same manager. So a
drafter is more groups of the same `ModelSpec`, flagged `draft` and named
`draft.<group>`, with layer indices after the target's: the plan gives them
their own pools, the manager their own page tables, and an engine model can
group them as the engine does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec.groups import Drafter, LayerGroup, ModelSpec
from kvpool.spec.loader import read_model_config, spec_from_read

DRAFT_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
DRAFT_PREFIX = "draft."
MTP = "mtp"  # `--draft-model mtp`: the model's own multi-token-prediction layers


def mtp_layer_count(config: Mapping[str, Any]) -> int:
    """The MTP layers a config declares (`num_nextn_predict_layers`, DeepSeek / GLM /
    MiMo; `mtp_num_hidden_layers`, Qwen3-Next / Qwen3.5), 0 when none."""
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def method_of(config: Mapping[str, Any]) -> str:
    """The drafting method a draft config implies: an EAGLE-3 head (`Eagle3` in its
    architectures, or its `target_hidden_size` / `eagle_aux_hidden_state_layer_ids`),
    an EAGLE head (`Eagle` in its architectures), else a separate draft model."""
    archs = " ".join(str(a) for a in config.get("architectures") or ())
    if "Eagle3" in archs or any(k in config for k in ("target_hidden_size", "eagle_aux_hidden_state_layer_ids")):
        return "eagle3"
    if "Eagle" in archs:
        return "eagle"
    return "draft_model"


def with_draft(spec: ModelSpec, draft: ModelSpec, method: str, source: str | None = None) -> ModelSpec:
    """`spec` with `draft`'s groups appended as the drafter's: named `draft.<group>`,
    flagged `draft`, layers numbered after the target's. Both must be read at the
    same KV dtype, tensor-parallel size and page size (a drafter shares the
    target's cache config); SpecError otherwise, or when `spec` already has one."""
    if method not in DRAFT_METHODS:
        raise SpecError(f"draft method {method!r}: use one of {', '.join(DRAFT_METHODS)}")
    if spec.drafter is not None:
        raise SpecError(f"{spec.name} already has a drafter ({spec.drafter.source})")
    for what, ours, theirs in (
        ("tokens per page", spec.tokens_per_block, draft.tokens_per_block),
        ("tensor-parallel size", spec.tp_size, draft.tp_size),
    ):
        if ours != theirs:
            raise SpecError(f"the drafter {draft.name} is read at {what} {theirs}, the model at {ours}")
    first = spec.num_layers
    groups = tuple(
        dataclasses.replace(g, name=DRAFT_PREFIX + g.name, layers=tuple(first + i for i in g.layers), draft=True)
        for g in draft.groups
    )
    drafter = Drafter(method, source or draft.name, draft.num_layers)
    return dataclasses.replace(spec, groups=spec.groups + groups, drafter=drafter)


def mtp_draft(spec: ModelSpec, layers: int | None = None) -> ModelSpec:
    """The model's own MTP layers as a drafter of `spec`: `layers` (default: what
    the config declares) decoder layers of the target's full-attention geometry
    (an MTP block reuses the target's decoder layer: DeepSeek's MLA, Qwen3-Next's
    gated attention), one group `draft.mtp`."""
    count = mtp_layer_count(spec.config) if layers is None else layers
    if count < 1:
        raise SpecError(f"{spec.name} declares no MTP layers (num_nextn_predict_layers / mtp_num_hidden_layers)")
    full = [g for g in spec.target_groups if g.kind == "full"]
    if not full:
        raise SpecError(f"{spec.name} has no full-attention layers for its MTP layers to copy")
    per_layer = full[0].row_bytes // len(full[0].layers)
    group = LayerGroup(
        "mtp", "full", tuple(range(count)), spec.tokens_per_block, row_bytes=per_layer * count, window=None
    )
    draft = dataclasses.replace(spec, name=f"{spec.name} MTP", groups=(group,), num_layers=count, drafter=None)
    return with_draft(spec, draft, MTP, f"{spec.name}'s {count} MTP layer{'s' * (count > 1)}")


def load_draft(
    spec: ModelSpec,
    draft_model: str | Path | Mapping[str, Any],
    *,
    method: str | None = None,
    max_seq_len: int | None = None,
) -> ModelSpec:
    """`spec` with a drafter: `mtp` for the model's own MTP layers, else a draft
    model or EAGLE head (preset, path, Hugging Face id or config dict) read at the
    target's KV dtype, tensor-parallel size and page size. `method` defaults to
    what the draft's config implies (`method_of`)."""
    if isinstance(draft_model, str) and draft_model == MTP:
        if method not in (None, MTP):
            raise SpecError(f"--draft-model mtp drafts with the model's MTP layers, not {method}")
        return mtp_draft(spec)
    read = read_model_config(draft_model)
    pp = spec.pp_stage[1] if spec.pp_stage else 1
    if pp > 1:
        raise SpecError("a drafter under pipeline parallelism is not modelled: plan it without --pp")
    draft = spec_from_read(
        read,
        kv_dtype=spec.kv_dtype,
        tp_size=spec.tp_size,
        tokens_per_block=spec.tokens_per_block,
        max_seq_len=max_seq_len,
    )
    return with_draft(spec, draft, method or method_of(read[2]), read[0])
