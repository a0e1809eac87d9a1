"""Dummy requests and the CUDA-graph warmup of `KVCacheManager`: the
algorithm is page arithmetic in `kvpool.plan.capture` (shared with the plan's
warnings); here only the argument checks of the manager's public methods."""

from __future__ import annotations

from kvpool.cache.events import CacheUsageError
from kvpool.plan.capture import (
    DummyPages,
    SkippedShape,
    WarmupReport,
    dummy_shape,
    max_generation_length,
    shortfall,
    warmup,
)

__all__ = [
    "DummyPages",
    "SkippedShape",
    "WarmupReport",
    "check_dummy_args",
    "dummy_shape",
    "max_generation_length",
    "shortfall",
    "warmup",
]


def check_dummy_args(batch_size: int, token_num: int, draft_len: int) -> None:
    """Raise `CacheUsageError` unless batch_size, token_num >= 1 and draft_len >= 0 are integers."""
    for name, value, low in (("batch_size", batch_size, 1), ("token_num", token_num, 1), ("draft_len", draft_len, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CacheUsageError(f"{name} must be an integer >= {low}, got {value!r}")
