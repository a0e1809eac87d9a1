"""`ServingLimits`: the engine limits a plan must honour."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.errors import LimitsError
from kvpool.units import is_positive_int

# Upper bounds, so that a caller's typo fails here with the field's name rather than deep in the planner:
# the planner builds batches of B requests, so its time and memory grow with B (2**40 took 17 GB and never
# ended; the engines' defaults are 256 to 2,048, and vLLM 0.32's SchedulerConfig asks only max_num_seqs >= 1,
# so the bound is kvpool's own); positions and token counts are int32 in the engines' block tables (vLLM 0.32's
# v1/worker/block_table.py: torch.int32 rows, np.int32 counts) and in kvpool's (`cache/tables.py`).
MAX_BATCH_SIZE = 2**16
MAX_POSITIONS = 2**31 - 1


def default_cuda_graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8 up to min(max_batch_size, 256)."""
    top = min(max_batch_size, 256)
    return tuple(b for b in (1, 2, 4, *range(8, top + 1, 8)) if b <= top)


def _check_non_negative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LimitsError(f"{name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class ServingLimits:
    """Limits of one serving engine (one rank).

    `max_batch_size` B, `max_seq_len` L, `max_num_tokens` N (per-iteration token
    budget; None = no chunked-prefill budget), `max_draft_len` d, `num_extra_kv_tokens` E, `avg_seq_len` S (None =
    unknown: the plan then stays on the reference request),
    `cuda_graph_batch_sizes` (None = the default list).
    """

    max_batch_size: int = 256
    max_seq_len: int = 8192
    max_num_tokens: int | None = 8192
    max_draft_len: int = 0
    num_extra_kv_tokens: int = 0
    avg_seq_len: int | None = None
    cuda_graph_batch_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self._check_counts()
        if self.headroom + self.max_seq_len > MAX_POSITIONS:
            raise LimitsError(
                f"max_seq_len {self.max_seq_len} plus the decode headroom {self.headroom} passes {MAX_POSITIONS}"
            )
        if self.avg_seq_len is not None and self.avg_seq_len > self.max_seq_len:
            raise LimitsError(
                f"avg_seq_len {self.avg_seq_len} exceeds max_seq_len {self.max_seq_len}; "
                "lower --avg-seq-len or raise --max-seq-len"
            )
        if self.cuda_graph_batch_sizes is not None:
            object.__setattr__(self, "cuda_graph_batch_sizes", self._graph_sizes(self.cuda_graph_batch_sizes))

    def _check_counts(self) -> None:
        """Each count an int of its domain: positive, or non-negative, and within
        what a batch (`MAX_BATCH_SIZE`) or int32 positions (`MAX_POSITIONS`) hold."""
        positive = {"max_batch_size": self.max_batch_size, "max_seq_len": self.max_seq_len}
        optional = {"max_num_tokens": self.max_num_tokens, "avg_seq_len": self.avg_seq_len}
        for name, value in {**positive, **{k: v for k, v in optional.items() if v is not None}}.items():
            if not is_positive_int(value):
                raise LimitsError(f"{name} must be a positive integer, got {value!r}")
        for name, value in {
            "max_draft_len": self.max_draft_len,
            "num_extra_kv_tokens": self.num_extra_kv_tokens,
        }.items():
            _check_non_negative(name, value)
        if self.max_batch_size > MAX_BATCH_SIZE:
            raise LimitsError(f"max_batch_size must be at most {MAX_BATCH_SIZE}, got {self.max_batch_size}")
        counts: dict[str, int | None] = {
            **optional,
            "max_seq_len": self.max_seq_len,
            "max_draft_len": self.max_draft_len,
        }
        for name, count in counts.items():
            if count is not None and count > MAX_POSITIONS:
                raise LimitsError(f"{name} must be at most {MAX_POSITIONS} (int32 positions), got {count}")

    def _graph_sizes(self, given: Sequence[int]) -> tuple[int, ...]:
        """The CUDA-graph batch sizes, sorted and unique: positive ints, none past max_batch_size."""
        sizes = tuple(given)
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
            raise LimitsError(f"cuda_graph_batch_sizes must be positive integers, got {sizes!r}")
        if max(sizes) > self.max_batch_size:
            raise LimitsError(f"cuda graph batch size {max(sizes)} exceeds max_batch_size {self.max_batch_size}")
        return tuple(sorted(set(sizes)))

    @property
    def headroom(self) -> int:
        """Most that capacity leads history in a decode step: 1 + d + E."""
        return 1 + self.max_draft_len + self.num_extra_kv_tokens

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """The CUDA-graph batch sizes in force (explicit or default), ascending."""
        return self.cuda_graph_batch_sizes or default_cuda_graph_batch_sizes(self.max_batch_size)

    @property
    def largest_graph_batch(self) -> int:
        """The largest CUDA-graph batch size: the most padded decodes warmup runs at once."""
        return max(self.graph_batch_sizes)

    def clamped(self, *, max_batch_size: int | None = None, max_seq_len: int | None = None) -> ServingLimits:
        """These limits with a smaller B and/or L; `avg_seq_len` and the CUDA-graph
        batch sizes are clamped so that the result stays valid. Returns a new object."""
        b = self.max_batch_size if max_batch_size is None else max_batch_size
        seq = self.max_seq_len if max_seq_len is None else max_seq_len
        avg = None if self.avg_seq_len is None else min(self.avg_seq_len, seq)
        graphs = None
        if self.cuda_graph_batch_sizes is not None:
            graphs = tuple(g for g in self.cuda_graph_batch_sizes if g <= b) or (b,)
        return dataclasses.replace(
            self, max_batch_size=b, max_seq_len=seq, avg_seq_len=avg, cuda_graph_batch_sizes=graphs
        )
