"""spec: what a model keeps per token and per request (NumPy-free, pure data)."""

from kvpool.spec.dtypes import KV_DTYPES
from kvpool.spec.groups import KINDS, Kind, LayerGroup, ModelSpec
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
    "KINDS", "KV_DTYPES", "Kind", "LayerGroup", "ModelSpec", "Shape", "batch_pages",
    "decode_worst_case_pages", "load_model_spec", "pages_needed", "pages_per_group", "stale_pages",
]
