"""Occupancy ratio: pages held over each request's time in flight (Little's law).

The mean pages a pool holds equal the arrival rate times the pages each
request holds integrated over its time in flight, so a group's share of the
budget should follow `sum over requests of (pages x steps)`. `Workload`
counts decode steps only; this model also counts the prefill phase:

- a prompt of `p` tokens is computed in `ceil(p / c)` chunks, one per step,
  where `c` is the per-step token budget left for prefills (`N` minus the
  decode rows that share the step, estimated as `decode_share x B`; the whole
  prompt in one step without a budget);
- during chunk `j` the request holds a prefill of capacity `min((j+1)c, p)`
  with history `j c` (a sliding group keeps its window plus the chunk, so a
  chunk of 8,192 tokens holds 256 window pages of 32 tokens);
- then `o - 1` decode steps at lengths `p + 1 .. p + o - 1` (sampled as
  `Workload` does), the first output token being sampled at the prefill's end.

Long requests stay longer, so they weigh more than in the arrival mix; short
outputs after long prompts (summarisation, code) weigh their prefill steps.
Lengths are clipped to `max_seq_len` (prompts of at least L are left out, as
the simulator rejects them). Reuse is ignored (a reused prefix is charged as
if computed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from kvpool.errors import LimitsError
from kvpool.plan.batches import decode_shape
from kvpool.plan.limits import ServingLimits
from kvpool.plan.workload import Workload
from kvpool.spec import ModelSpec, Shape, pages_needed


class Occupancy:
    """Ratio from (prompt, output) length pairs weighted by time in flight,
    prefill chunks included (module docstring). `decode_share` is the share of
    B that decodes in a prefill step (0.5 by default); `samples` bounds the
    decode steps sampled per request."""

    name = "occupancy"

    def __init__(
        self,
        lengths: Iterable[tuple[int, int]] | npt.NDArray[np.integer[Any]],
        *,
        samples: int = 16,
        decode_share: float = 0.5,
    ):
        if not 0 <= decode_share <= 1:
            raise LimitsError(f"decode_share must lie in [0, 1], got {decode_share}")
        self.workload = Workload(lengths, samples=samples)
        self.decode_share = decode_share

    def __len__(self) -> int:
        return len(self.workload)

    def chunk_tokens(self, limits: ServingLimits) -> int | None:
        """Prefill tokens one request gets per step (None: no token budget)."""
        if limits.max_num_tokens is None:
            return None
        decodes = int(self.decode_share * limits.max_batch_size)
        return max(limits.max_num_tokens - decodes, limits.max_num_tokens // 4, 1)

    def phase_steps(self, limits: ServingLimits) -> tuple[float, float]:
        """Mean prefill steps and mean decode steps per admitted request."""
        p, o = self._clipped(limits)
        c = self.chunk_tokens(limits)
        pre = np.ones_like(p) if c is None else -(-p // c)
        return float(pre.mean()), float(np.maximum(o - 1, 0).mean())

    def _clipped(self, limits: ServingLimits) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        p, o = self.workload.prompts, self.workload.outputs
        keep = p < limits.max_seq_len
        if not keep.any():
            raise LimitsError(f"every prompt is at least max_seq_len ({limits.max_seq_len}) tokens")
        p, o = p[keep], o[keep]
        return p, np.minimum(o, limits.max_seq_len - p)

    def prefill_shapes(self, limits: ServingLimits) -> tuple[list[Shape], npt.NDArray[np.float64]]:
        """Distinct prefill-chunk shapes (capacity, history) and the steps spent in each."""
        p, _ = self._clipped(limits)
        c = self.chunk_tokens(limits)
        counts: dict[Shape, float] = {}
        values, mult = np.unique(p, return_counts=True)
        for prompt, m in zip(values.tolist(), mult.tolist(), strict=True):
            chunk = prompt if c is None else c
            for start in range(0, prompt, chunk):
                shape = Shape(min(start + chunk, prompt), start)
                counts[shape] = counts.get(shape, 0.0) + m
        shapes = list(counts)
        return shapes, np.array([counts[s] for s in shapes], dtype=np.float64)

    def expected_pages(self, spec: ModelSpec, limits: ServingLimits) -> dict[str, float]:
        """Pages x steps per group, prefill chunks plus decodes, over all requests."""
        p, o = self._clipped(limits)
        more = o > 1  # decode steps after the prefill sampled the first token
        if more.any():
            values, weights = Workload(
                np.stack([p[more], o[more] - 1], axis=1), samples=self.workload.samples
            ).length_weights(limits.max_seq_len)
        else:
            values, weights = np.zeros(0, dtype=np.int64), np.zeros(0)
        shapes, steps = self.prefill_shapes(limits)
        out = {}
        for g in spec.groups:
            dec = np.array([pages_needed(g, *decode_shape(int(n), limits)) for n in values])
            pre = np.array([pages_needed(g, s.capacity, s.history) for s in shapes])
            out[g.name] = float(dec @ weights + pre @ steps)
        return out

    def ratio(self, spec: ModelSpec, limits: ServingLimits) -> dict[str, float]:
        """Each group's share of the expected bytes held over time."""
        pages = self.expected_pages(spec, limits)
        bytes_ = {g.name: pages[g.name] * g.slot_bytes for g in spec.groups}
        total = sum(bytes_.values()) or 1.0
        return {k: v / total for k, v in bytes_.items()}

    def assumptions(self, limits: ServingLimits) -> str:
        """One line on what the model assumed (for a plan's notes)."""
        pre, dec = self.phase_steps(limits)
        c = self.chunk_tokens(limits)
        return (
            f"occupancy: {len(self)} requests, prefill chunks of "
            f"{'the whole prompt' if c is None else f'{c} tokens'} "
            f"(N minus {self.decode_share:.0%} of B decoding), {pre:.2f} prefill + {dec:.1f} "
            f"decode steps per request; reuse ignored"
        )
