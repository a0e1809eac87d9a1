"""What a model keeps per token and per request: layer groups and the model spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.errors import SpecError
from kvpool.models import ModelSource
from kvpool.spec.kinds import KindRule, kind_rule

Kind = str  # a name registered in `spec.kinds.RULES`: full, sliding, chunked, compressed, state


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one page pool: same life cycle, same bytes per page.

    `row_bytes` is one stored row summed over the group's layers: one position
    for `full`/`sliding`/`chunked`, one compressed row (covering `ratio`
    positions) for `compressed`. A page covers `tokens_per_block` positions.
    `state` groups hold `state_bytes` per request and no pages of positions.
    `window` is the sliding window W or the chunk size C. `draft` marks the
    layers of a speculative drafter (a draft model, an EAGLE head, the model's
    own MTP layers): their own group and pool, paged like the target's
    (spec/drafts.py).
    """

    name: str
    kind: Kind
    layers: tuple[int, ...]
    tokens_per_block: int
    row_bytes: int = 0
    state_bytes: int = 0
    window: int | None = None
    ratio: int | None = None
    draft: bool = False
    # one layer's bytes split into the tensors an engine keeps apart (a Mamba layer's
    # conv and SSM state, each its own pool in TensorRT-LLM V2); empty: one buffer, or K and V
    buffers: tuple[int, ...] = field(default=(), compare=False)
    # the kind's rule, looked up once: the page arithmetic asks it on every resize
    rule: KindRule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rule = kind_rule(self.kind)
        object.__setattr__(self, "rule", rule)
        if self.tokens_per_block <= 0:
            raise SpecError(f"tokens_per_block must be positive, got {self.tokens_per_block}")
        rule.validate(self)
        if rule.per_request and self.state_bytes <= 0:
            raise SpecError(f"group {self.name}: a {self.kind} group needs state_bytes > 0")
        if not rule.per_request and self.row_bytes <= 0:
            raise SpecError(f"group {self.name}: row_bytes must be positive")

    @property
    def rows_per_page(self) -> int:
        """Stored rows in one page (tpb, or tpb / ratio for compressed groups)."""
        return self.rule.rows_per_page(self)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page (0 for state groups, whose slot is `state_bytes`)."""
        return self.row_bytes * self.rows_per_page

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot of this group's pool: a page, or one request's state."""
        return self.state_bytes if self.rule.per_request else self.page_bytes

    @property
    def bytes_per_token(self) -> float:
        """Average bytes per position (0 for state groups)."""
        return self.page_bytes / self.tokens_per_block


@dataclass(frozen=True)
class Drafter:
    """Who drafts for speculative decoding, when the spec holds a drafter's layers:
    `method` as vLLM names it (`draft_model`, `eagle`, `eagle3`, `mtp`), the model
    it came from, and its layers (the groups flagged `draft`)."""

    method: str
    source: str
    num_layers: int


@dataclass(frozen=True)
class ModelSpec:
    """A model's KV layout at one dtype, tensor-parallel size and page size."""

    name: str
    family: str
    groups: tuple[LayerGroup, ...]
    tokens_per_block: int
    kv_dtype: str
    tp_size: int
    num_layers: int
    max_position_embeddings: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # why `auto` became `kv_dtype` when that is not simply the config's dtype (a
    # float32 checkpoint served in bf16, a KV scheme in quantization_config)
    kv_dtype_note: str | None = field(default=None, compare=False)
    # where the config came from (preset, path or Hugging Face id); None for a dict
    source: ModelSource | None = field(default=None, compare=False)
    # (stage index, pp size) when the spec is one pipeline stage's layers (spec/stages.py)
    pp_stage: tuple[int, int] | None = None
    # the speculative drafter whose layers the `draft` groups hold (spec/drafts.py), if any
    drafter: Drafter | None = None
    # the Mamba SSM state's dtype as asked (vLLM's --mamba-ssm-cache-dtype; auto: the family's)
    ssm_dtype: str = "auto"

    def __post_init__(self) -> None:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise SpecError(f"duplicate group names in {names}")
        if not self.groups:
            raise SpecError(f"model {self.name} keeps no KV state")
        # one page size for the whole model: prefix reuse hashes one page of positions for every group
        other = [f"{g.name} ({g.tokens_per_block})" for g in self.groups if g.tokens_per_block != self.tokens_per_block]
        if other:
            raise SpecError(
                f"model {self.name}: groups {', '.join(other)} disagree with the model's {self.tokens_per_block} "
                "tokens per page; every group must use the spec's tokens_per_block"
            )

    @property
    def target_groups(self) -> tuple[LayerGroup, ...]:
        """The groups of the served model itself (no drafter's)."""
        return tuple(g for g in self.groups if not g.draft)

    @property
    def draft_groups(self) -> tuple[LayerGroup, ...]:
        """The speculative drafter's groups (empty without one)."""
        return tuple(g for g in self.groups if g.draft)

    def group(self, name: str) -> LayerGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"model {self.name} has no group {name!r}; groups: {self.group_names}")

    @property
    def group_names(self) -> list[str]:
        return [g.name for g in self.groups]

    @property
    def full_attention_bytes_per_token(self) -> int:
        """Bytes per position summed over `full` groups."""
        return sum(g.row_bytes for g in self.groups if g.kind == "full")

    def with_tokens_per_block(self, tokens_per_block: int) -> ModelSpec:
        """The same model with another page size (re-validates compressed ratios)."""
        if tokens_per_block == self.tokens_per_block:
            return self
        groups = tuple(dataclasses.replace(g, tokens_per_block=tokens_per_block) for g in self.groups)
        return dataclasses.replace(self, groups=groups, tokens_per_block=tokens_per_block)
