"""Trace rows -> scheduler `Sequence`s with synthetic token ids.

Token ids only matter for prefix reuse. A trace with Mooncake `hash_ids` gets
the ids of its blocks: block id b covers tokens `b * B .. b * B + B - 1` (B =
the trace's block size, 512), so two prompts that share leading block ids share
leading tokens, and the manager's prefix reuse turns that into hits at its own
page size. Without hash ids every prompt is unique: nothing can be reused, so
the simulator then runs with reuse off and gives the scheduler zeros (only the
length matters).
"""

from __future__ import annotations

import numpy as np

from kvpool.sched import Sequence
from kvpool.trace import Trace

OUTPUT_TOKEN = 1  # what every simulated decode step samples (no EOS: lengths come from the trace)


def prompt_ids(trace: Trace, i: int) -> list[int]:
    """Synthetic prompt token ids of request `i` (see the module docstring)."""
    n = int(trace.prompt_len[i])
    if trace.hash_ids is None:
        return [0] * n
    block = trace.hash_block_tokens
    ids = np.asarray(trace.hash_ids[i], dtype=np.int64)
    tokens = (ids[:, None] * block + np.arange(block, dtype=np.int64)[None, :]).ravel()
    return list(tokens[:n].tolist())


def make_sequence(trace: Trace, i: int, max_seq_len: int) -> Sequence | None:
    """Request `i` as a Sequence, its output capped so prompt + output ≤
    `max_seq_len` (an engine stops there too); None when its prompt alone leaves
    no room to generate (an engine rejects it)."""
    prompt = int(trace.prompt_len[i])
    if prompt >= max_seq_len:
        return None
    arrival = float(trace.arrival_s[i]) if trace.arrival_s is not None else 0.0
    out = min(int(trace.output_len[i]), max_seq_len - prompt)
    return Sequence(rid=i, prompt_ids=prompt_ids(trace, i), max_new_tokens=out, arrival_s=arrival)
