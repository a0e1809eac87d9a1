"""What one scheduler iteration runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.sched.sequence import Sequence


@dataclass(frozen=True)
class Step:
    """One iteration's batch.

    `prefills`: (sequence, start position, number of tokens) chunks; a chunk that
    reaches the end of the sequence's tokens samples one token. `decodes`:
    (sequence, draft tokens reserved) rows. `preempted`: requests whose pages
    were freed this step (back at the head of the queue, recomputed later).
    `rejected`: requests dropped because they can never fit. `batch_size`:
    decode rows; `padded_batch_size`: the captured CUDA-graph batch size the
    decode batch pads to (None when the step cannot replay a graph);
    `padding_rid`: the padding dummy used; `graph`: whether the step replays a
    CUDA graph (decode-only, padded shape captured, padding dummy present).
    """

    prefills: list[tuple[Sequence, int, int]]
    decodes: list[tuple[Sequence, int]]
    preempted: list[Sequence]
    batch_size: int
    padded_batch_size: int | None
    padding_rid: int | None
    graph: bool
    rejected: list[Sequence] = field(default_factory=list)
    draft_len: int = 0  # the graph's draft length: the largest draft of a decode row

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step (prefill chunks + decode inputs with drafts)."""
        return sum(n for _, _, n in self.prefills) + sum(1 + k for _, k in self.decodes)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes
