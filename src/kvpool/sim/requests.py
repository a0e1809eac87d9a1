"""Trace rows -> requests a replica takes (`TraceRequest`) -> scheduler
`Sequence`s with synthetic token ids.

Token ids only matter for prefix reuse. A trace with Mooncake `hash_ids` gets
the ids of its blocks: block id b covers tokens `b * B .. b * B + B - 1` (B =
the trace's block size, 512), so two prompts that share leading block ids share
leading tokens, and the manager's prefix reuse turns that into hits at its own
page size. Without hash ids every prompt is unique: request r's prompt repeats
one id of its own, `UNIQUE_BASE + r` (above any block's ids), so no page hits
between requests, yet reuse stays on as in the engines (vLLM V1's prefix
caching, SGLang's radix cache): a request preempted by recompute finds its own
pages that were not evicted when it is readmitted, instead of recomputing its
prompt from token 0. The digests are chained, so its pages still differ.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import cache

import numpy as np

from kvpool.sched import Sequence
from kvpool.trace import MOONCAKE_BLOCK_TOKENS, Trace

OUTPUT_TOKEN = 1  # what every simulated decode step samples (no EOS: lengths come from the trace)
UNIQUE_BASE = 1 << 62  # request r's prompt without hash ids: ids UNIQUE_BASE + r (blocks' ids stay far below)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One row of a trace as a replica takes it: its id (`rid`, unique in the
    replica), prompt and output lengths, and its prompt's Mooncake block ids
    (None: a unique prompt, see the module docstring). Small: the token ids are built only when the
    replica admits it (`prompt_ids`)."""

    rid: int
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @classmethod
    def of(cls, trace: Trace, i: int) -> TraceRequest:
        """Row `i` of `trace`, with id `i`."""
        hashes = trace.hash_ids[i] if trace.hash_ids is not None else None
        return cls(i, int(trace.prompt_len[i]), int(trace.output_len[i]), hashes, trace.hash_block_tokens)

    def prompt_ids(self) -> list[int]:
        """Synthetic prompt token ids (see the module docstring)."""
        return self.prompt_array().tolist()

    def prompt_array(self) -> array[int]:
        """`prompt_ids` packed as int64 (`array("q")`), what a `Sequence` keeps."""
        if self.hash_ids is None:
            return array("q", (UNIQUE_BASE + self.rid,)) * self.prompt_len
        block = self.hash_block_tokens
        # each block's offsets 0..B-1 (a C copy per block), then each row shifted by its block's first id in
        # place: about a fifth less CPU than NumPy's outer sum copied into an array
        out = block_offsets(block) * len(self.hash_ids)
        rows = np.frombuffer(out, np.int64).reshape(len(self.hash_ids), block)
        rows += np.asarray(self.hash_ids, dtype=np.int64)[:, None] * block
        del rows  # (a view of `out`'s buffer: `out` can shrink once it is gone)
        del out[self.prompt_len :]
        return out

    def sequence(self, arrival_s: float, max_seq_len: int) -> Sequence | None:
        """The request as a Sequence, its output capped so prompt + output ≤
        `max_seq_len` (an engine stops there too); None when its prompt alone
        leaves no room to generate (an engine rejects it)."""
        if self.prompt_len >= max_seq_len:
            return None
        out = min(self.output_len, max_seq_len - self.prompt_len)
        return Sequence(rid=self.rid, prompt_ids=self.prompt_array(), max_new_tokens=out, arrival_s=arrival_s)


@cache
def block_offsets(block: int) -> array[int]:
    """0, 1, ..., block - 1 as int64: a block's token ids less its first."""
    return array("q", range(block))


def prompt_ids(trace: Trace, i: int) -> list[int]:
    """Synthetic prompt token ids of request `i` (see the module docstring)."""
    return TraceRequest.of(trace, i).prompt_ids()


def make_sequence(trace: Trace, i: int, max_seq_len: int) -> Sequence | None:
    """Request `i` as a Sequence (`TraceRequest.sequence` at its arrival time)."""
    arrival = float(trace.arrival_s[i]) if trace.arrival_s is not None else 0.0
    return TraceRequest.of(trace, i).sequence(arrival, max_seq_len)
