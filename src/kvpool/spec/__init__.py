"""spec: what a model keeps per token and per request (NumPy-free, pure data)."""

from kvpool.spec.dtypes import KV_DTYPES
from kvpool.spec.groups import Kind, LayerGroup, ModelSpec
from kvpool.spec.kinds import RULES, KindRule, kind_rule, register_kind
from kvpool.spec.loader import load_model_spec
from kvpool.spec.pages import (
    Shape,
    batch_pages,
    decode_worst_case_pages,
    pages_needed,
    pages_per_group,
    stale_pages,
)

__all__ = [
    "KV_DTYPES",
    "RULES",
    "Kind",
    "KindRule",
    "LayerGroup",
    "ModelSpec",
    "Shape",
    "batch_pages",
    "decode_worst_case_pages",
    "kind_rule",
    "load_model_spec",
    "pages_needed",
    "pages_per_group",
    "register_kind",
    "stale_pages",
]
