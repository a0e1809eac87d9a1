"""What one simulated run measured, and its JSON form."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.plan import PoolPlan


@dataclass(frozen=True)
class GroupUsage:
    """Pages of one pool group: `total`, most used at once, time-weighted mean used."""

    total: int
    peak_used: int
    mean_used: float


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request, in simulated seconds: when it arrived, sampled
    its first token and finished; its prompt and output tokens, the prompt
    tokens its first admission found cached, and how often it was preempted.
    What a fleet aggregates over its replicas."""

    rid: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_len: int
    output_len: int
    cached_tokens: int
    preemptions: int

    @property
    def ttft_s(self) -> float:
        """Time to first token."""
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        """Arrival to last token."""
        return self.finish_s - self.arrival_s

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency (the request's TPOT); None with one output token."""
        return (self.finish_s - self.first_token_s) / (self.output_len - 1) if self.output_len > 1 else None


@dataclass(frozen=True)
class SimResult:
    """One run of a trace against one plan. Times are simulated seconds.

    `ttft_s` / `tpot_s`: per finished request (TPOT only for requests with at
    least two output tokens). `rejected`: requests whose prompt leaves no room
    under max_seq_len or that never fit in the pools. `graph_steps` /
    `decode_steps`: steps replayed as CUDA graphs / steps with decode rows;
    `padding_failures`: decode-only steps that needed a padding dummy and had
    none (the Gemma 4 failure). `captured` / `skipped`: warmup shapes.
    `end_used` equals `reserved` when no page leaked. `requests`: one
    record per finished request (with a first token), in finishing order.
    """

    policy: str
    plan: PoolPlan
    num_requests: int
    finished: int
    rejected: int
    output_tokens: int
    makespan_s: float
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    preemptions: int
    steps: int
    decode_steps: int
    decode_only_steps: int
    graph_steps: int
    padding_failures: int
    pages: dict[str, GroupUsage]
    captured: int = 0
    skipped: int = 0
    reuse_hit_rate: float = 0.0  # the manager's: reused / looked-up tokens over every lookup
    prefill_tokens: int = 0  # prompt positions computed, recomputed ones (after a preemption) again
    prompt_hit_rate: float = 0.0  # of finished requests' prompt tokens, those a hit covered at their first admission
    wall_s: float = 0.0
    end_used: dict[str, int] = field(default_factory=dict)  # pages used after the last request
    reserved: dict[str, int] = field(default_factory=dict)  # of which padding reservations
    rebalance: dict[str, Any] | None = None  # moves and pages moved of an online rebalanced run
    online: dict[str, Any] | None = None  # the `online` policy's segments, shares and restarts
    tiers: dict[str, Any] | None = None  # a run with cold tiers: pages moved, suspensions, copy time
    requests: tuple[RequestRecord, ...] = ()

    @property
    def moved_split(self) -> bool:
        """Whether the split changed while it ran (`rebalance`, `online`): no one static split."""
        return self.rebalance is not None or self.online is not None

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.finished / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def graph_step_share(self) -> float:
        """Share of the steps with decode rows that replayed a CUDA graph."""
        return self.graph_steps / self.decode_steps if self.decode_steps else 0.0

    def percentile(self, values: np.ndarray, q: float) -> float | None:
        return linear_percentile(values, q) if values.size else None

    def to_json(self) -> dict[str, Any]:
        """The run as `kvpool simulate --json` prints it."""
        return {
            "policy": self.policy,
            "output_tokens_per_s": self.output_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "ttft_p50_s": self.percentile(self.ttft_s, 50),
            "ttft_p99_s": self.percentile(self.ttft_s, 99),
            "tpot_p50_s": self.percentile(self.tpot_s, 50),
            "preemptions": self.preemptions,
            "graph_step_share": self.graph_step_share,
            "pages": {name: {"total": u.total, "peak_used": u.peak_used} for name, u in self.pages.items()},
            **({"rebalance": self.rebalance} if self.rebalance is not None else {}),
            **({"online": self.online} if self.online is not None else {}),
            **(
                {"prompt_hit_rate": self.prompt_hit_rate, "reuse_hit_rate": self.reuse_hit_rate, "tiers": self.tiers}
                if self.tiers is not None
                else {}
            ),
        }


def linear_percentile(values: np.ndarray, q: float) -> float:
    """`np.percentile(values, q)` (its default, linear method) of a non-empty
    array, to the bit: NumPy's own arithmetic (`_quantile`, `_lerp`) on the two
    neighbours of the sorted array. NumPy's path through `np.unique` imports
    `numpy.ma` (about 45 M instructions of a run's start); other dtypes and
    non-finite values and a q outside [0, 100] go to NumPy itself."""
    s = np.sort(values, axis=None)
    if s.dtype != np.float64 or not (math.isfinite(s[0]) and math.isfinite(s[-1]) and 0 <= q <= 100):
        return float(np.percentile(values, q))
    last = len(s) - 1
    virtual = last * (q / 100)
    if virtual >= last:  # NumPy interpolates the last value with itself
        return float(s[-1])
    below = math.floor(virtual)
    a, b = float(s[below]), float(s[below + 1])
    t = virtual - below
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t
