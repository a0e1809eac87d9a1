"""`Trace`: the workload type that the simulator, the planner's workload
policies and the CLI share — per request a prompt length, an output length,
optionally an arrival time and prefix-block hashes. Loading traces from files
and bundled data lives in `kvpool.presets.traces`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from kvpool.errors import KvpoolError

MOONCAKE_BLOCK_TOKENS = 512  # tokens per prefix block of a Mooncake trace's hash_ids

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class TraceError(KvpoolError, ValueError):
    """A trace file that cannot be read (missing, malformed, impossible lengths)."""


@dataclass(frozen=True, eq=False)
class Trace:
    """A request trace. `prompt_len` and `output_len` are int64 arrays (each ≥ 1),
    `arrival_s` float64 seconds from the first request (sorted, finite) or None
    when the trace has no times; `hash_ids` per request (Mooncake prefix blocks
    of `hash_block_tokens` tokens) or None."""

    name: str
    prompt_len: IntArray
    output_len: IntArray
    arrival_s: FloatArray | None = None
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __post_init__(self) -> None:
        n = len(self.prompt_len)
        if (
            len(self.output_len) != n
            or (self.arrival_s is not None and len(self.arrival_s) != n)
            or (self.hash_ids is not None and len(self.hash_ids) != n)
        ):
            raise TraceError(f"trace {self.name}: columns have different lengths")

    def __len__(self) -> int:
        return len(self.prompt_len)

    def lengths(self) -> list[tuple[int, int]]:
        """(prompt, output) pairs, e.g. for `plan_pools(policy=Workload(...))`."""
        return list(zip(self.prompt_len.tolist(), self.output_len.tolist(), strict=True))

    def head(self, n: int | None) -> Trace:
        """The first `n` requests (all when `n` is None)."""
        if n is None or n >= len(self):
            return self
        if n < 1:
            raise TraceError(f"max requests must be positive, got {n}")
        return replace(
            self,
            prompt_len=self.prompt_len[:n],
            output_len=self.output_len[:n],
            arrival_s=None if self.arrival_s is None else self.arrival_s[:n],
            hash_ids=None if self.hash_ids is None else self.hash_ids[:n],
        )

    def span(self, first: int, end: int, name: str | None = None) -> Trace:
        """Requests `first:end`, re-timed from 0 (prefix hashes kept), named
        `name` (default: this trace's name and the range)."""
        idx = slice(first, end)
        return replace(
            self,
            name=f"{self.name} [{first}:{end}]" if name is None else name,
            prompt_len=self.prompt_len[idx],
            output_len=self.output_len[idx],
            arrival_s=None if self.arrival_s is None else self.arrival_s[idx] - self.arrival_s[first],
            hash_ids=None if self.hash_ids is None else self.hash_ids[idx],
        )

    def with_rate(self, rate: float | None, seed: int = 0) -> Trace:
        """Arrivals at `rate` requests/s on average. None: the trace's own times
        (all at 0 when it has none); inf: all at 0 (offline throughput); a finite
        rate rescales the trace's times so that n requests span n / rate
        seconds, or draws Poisson arrivals (seeded) when the trace has no times
        or all its times are equal. Returns a new trace."""
        n = len(self)
        if rate is None:
            return self if self.arrival_s is not None else replace(self, arrival_s=np.zeros(n))
        if math.isnan(rate) or rate <= 0:
            raise TraceError(f"rate must be positive (or inf), got {rate}")
        if math.isinf(rate):
            return replace(self, arrival_s=np.zeros(n))
        span = float(self.arrival_s[-1]) if self.arrival_s is not None and n > 1 else 0.0
        if span > 0:
            assert self.arrival_s is not None
            # Observed mean rate is n / span; scale times so it becomes `rate`.
            return replace(self, arrival_s=self.arrival_s * (n / rate / span))
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
        gaps[0] = 0.0
        return replace(self, arrival_s=np.cumsum(gaps))


def concat_traces(parts: list[Trace], name: str | None = None) -> Trace:
    """`parts` one after another (a mix that shifts, e.g. chat then long
    documents). Re-timed: each part keeps its own gaps and starts one mean gap
    of its own after the previous part's last arrival (all at 0 when no part
    has times). Prefix hashes: when some part has them, a part without gets
    fresh block ids that no other request shares (its prompts stay unique)."""
    if not parts:
        raise TraceError("concatenating traces needs at least one trace")
    blocks = {p.hash_block_tokens for p in parts}
    if len(blocks) > 1:
        raise TraceError(f"traces with different hash block sizes {sorted(blocks)} cannot be concatenated")
    block = blocks.pop()
    timed = any(p.arrival_s is not None for p in parts)
    times: list[FloatArray] = []
    offset = 0.0
    for p in parts:
        t = p.arrival_s if p.arrival_s is not None else np.zeros(len(p))
        gap = float(t[-1] - t[0]) / (len(p) - 1) if len(p) > 1 else 0.0
        start = offset + gap if times else 0.0
        times.append(t - t[0] + start)
        offset = float(times[-1][-1])
    hashes: list[tuple[int, ...]] | None = None
    if any(p.hash_ids is not None for p in parts):
        fresh = 1 + max((max(h) for p in parts if p.hash_ids is not None for h in p.hash_ids if h), default=-1)
        hashes = []
        for p in parts:
            if p.hash_ids is not None:
                hashes.extend(p.hash_ids)
                continue
            for n in (-(-int(x) // block) for x in p.prompt_len.tolist()):
                hashes.append(tuple(range(fresh, fresh + n)))
                fresh += n
    return Trace(
        name or "+".join(p.name for p in parts),
        np.concatenate([p.prompt_len for p in parts]),
        np.concatenate([p.output_len for p in parts]),
        np.concatenate(times) if timed else None,
        tuple(hashes) if hashes is not None else None,
        block,
    )
