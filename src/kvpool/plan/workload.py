"""Workload-aware ratio: expected pages per group over a length distribution.

One mean length hides what matters for hybrid models: a sliding group's need
saturates at its window while a full group's keeps growing, so the expected
pages of a mix of short and long requests differ from the pages of the mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvpool.errors import LimitsError
from kvpool.plan.batches import decode_shape
from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec, pages_needed


class RatioPolicy(Protocol):
    """Anything that sets the pool ratio: `name` for the report, `ratio` the
    byte share per group name (summing to 1)."""

    name: str

    def ratio(self, spec: ModelSpec, limits: ServingLimits) -> dict[str, float]: ...


class Workload:
    """Ratio from (prompt, output) length pairs, e.g. a trace.

    A request is in memory for about `output` decode steps; at step t it holds
    the pages of a decode at length `prompt + t + 1` (kvpool.spec.pages). Its
    expected pages per group are the mean over `samples` evenly spaced steps
    (all steps when it has fewer), weighted by `output`. Lengths are clipped to
    the limits' `max_seq_len`. The ratio is each group's share of the expected
    bytes. Prefill occupancy is ignored (short next to decode).
    """

    name = "workload"

    def __init__(self, lengths: Iterable[tuple[int, int]] | npt.NDArray[np.integer[Any]], *, samples: int = 16):
        pairs = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths))
        if pairs.size == 0:
            raise LimitsError("a workload needs at least one (prompt, output) length pair")
        if pairs.ndim != 2 or pairs.shape[1] != 2 or not np.issubdtype(pairs.dtype, np.integer):
            raise LimitsError("a workload is a sequence of (prompt, output) integer length pairs")
        if (pairs < 0).any() or (pairs.sum(axis=1) < 1).any():
            raise LimitsError("workload lengths must be non-negative and each request at least 1 token")
        if samples < 1:
            raise LimitsError(f"samples must be positive, got {samples}")
        self.prompts = pairs[:, 0].astype(np.int64)
        self.outputs = pairs[:, 1].astype(np.int64)
        self.samples = samples

    def __len__(self) -> int:
        return int(self.prompts.size)

    def length_weights(self, max_seq_len: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Distinct decode lengths and the request-steps spent at each."""
        steps = np.maximum(self.outputs, 1)
        k = np.minimum(steps, self.samples)
        j = np.arange(self.samples)
        # Sample j of a request with k samples sits at step floor((j + 0.5) * steps / k).
        offset = np.floor((j[None, :] + 0.5) * steps[:, None] / k[:, None]).astype(np.int64)
        lengths = np.minimum(self.prompts[:, None] + offset + 1, max_seq_len)
        weights = np.broadcast_to((steps / k)[:, None], lengths.shape)
        used = j[None, :] < k[:, None]
        values, inverse = np.unique(lengths[used], return_inverse=True)
        counts = np.bincount(inverse, weights=weights[used]).astype(np.float64)
        return values.astype(np.int64), counts

    def expected_pages(self, spec: ModelSpec, limits: ServingLimits) -> dict[str, float]:
        """Request-step-weighted pages per group (proportional to the expected
        pages held at any moment)."""
        values, weights = self.length_weights(limits.max_seq_len)
        out = {}
        for g in spec.groups:
            pages = np.array([pages_needed(g, *decode_shape(int(n), limits)) for n in values])
            out[g.name] = float(pages @ weights)
        return out

    def ratio(self, spec: ModelSpec, limits: ServingLimits) -> dict[str, float]:
        """Each group's share of the expected bytes."""
        pages = self.expected_pages(spec, limits)
        bytes_ = {g.name: pages[g.name] * g.slot_bytes for g in spec.groups}
        total = sum(bytes_.values())
        return {k: v / total for k, v in bytes_.items()}
