"""What a fleet's run measured: one record per request (which replicas served
it, when its first token and its last came out), summed up per replica and
for the fleet: prompt hit rate, TTFT / ITL / E2E percentiles, goodput under an
SLO, load imbalance.

ITL is a request's mean time between output tokens after the first,
`(finish - first token) / (outputs - 1)` (what kvpool's simulator calls TPOT,
and what Dynamo's mocker checks its `sla_itl_ms` against); its percentiles are
over requests. Goodput is the requests per second that finished within every
bound of the SLO (Dynamo's mocker: `goodput_request_throughput_rps`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.errors import KvpoolError
from kvpool.sim.metrics import SimResult
from kvpool.units import parse_duration

SLO_METRICS = ("ttft", "itl", "e2e")
SLO_QUANTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "max": 100.0}


class SloError(KvpoolError, ValueError):
    """An SLO that cannot be read (`ttft_p99=2s,itl_p99=50ms`)."""


@dataclass(frozen=True)
class Bound:
    """`metric`'s `quantile` percentile must be at most `seconds`."""

    metric: str
    quantile: float
    seconds: float

    @property
    def name(self) -> str:
        q = next(k for k, v in SLO_QUANTILES.items() if v == self.quantile)
        return f"{self.metric}_{q}"


@dataclass(frozen=True)
class Slo:
    """Bounds on the fleet's latency percentiles, e.g. `ttft_p99=2s,itl_p99=50ms`.
    A request is good when it meets every bound's limit itself (goodput); the
    fleet meets the SLO when every bound's percentile is within its limit."""

    bounds: tuple[Bound, ...]

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`METRIC_Q=DURATION,...`: METRIC one of ttft, itl, e2e; Q one of
        p50, p90, p95, p99, max; DURATION like 2s, 50ms, 1.5."""
        bounds: list[Bound] = []
        for item in text.split(","):
            key, eq, value = item.strip().partition("=")
            metric, _, q = key.strip().partition("_")
            if not eq or metric not in SLO_METRICS or q not in SLO_QUANTILES:
                raise SloError(
                    f"SLO item {item.strip()!r}: write METRIC_Q=DURATION with METRIC one of "
                    f"{', '.join(SLO_METRICS)} and Q one of {', '.join(SLO_QUANTILES)} (e.g. ttft_p99=2s,itl_p99=50ms)"
                )
            try:
                seconds = parse_duration(value)
            except KvpoolError as e:
                raise SloError(f"SLO item {item.strip()!r}: {e}") from None
            if any(b.metric == metric and b.quantile == SLO_QUANTILES[q] for b in bounds):
                raise SloError(f"SLO names {key.strip()} twice")
            bounds.append(Bound(metric, SLO_QUANTILES[q], seconds))
        return cls(tuple(bounds))

    def limit(self, metric: str) -> float:
        """The tightest limit on `metric` (inf when the SLO does not bound it)."""
        return min((b.seconds for b in self.bounds if b.metric == metric), default=math.inf)

    def __str__(self) -> str:
        return ",".join(f"{b.name}={b.seconds:g}s" for b in self.bounds)


@dataclass
class FleetRecord:
    """One request's life in the fleet (times in simulated seconds). `worker`:
    the replica that produced its tokens (the decode replica when
    disaggregated); `prefill_worker` and `transfer_s` only when disaggregated.
    `first_token_s` / `finish_s` stay None for a rejected request (one too
    long for max_seq_len is `too_long` as well)."""

    rid: int
    arrival_s: float
    prompt_len: int
    output_len: int
    worker: int = -1
    prefill_worker: int | None = None
    transfer_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    rejected: bool = False
    too_long: bool = False  # rejected unrouted: its prompt leaves no room under max_seq_len

    @property
    def done(self) -> bool:
        return self.finish_s is not None and not self.rejected

    @property
    def ttft(self) -> float:
        assert self.first_token_s is not None
        return self.first_token_s - self.arrival_s

    @property
    def e2e(self) -> float:
        assert self.finish_s is not None
        return self.finish_s - self.arrival_s

    @property
    def itl(self) -> float | None:
        if self.output_len < 2 or self.finish_s is None or self.first_token_s is None:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)

    def meets(self, slo: Slo) -> bool:
        """Done within each of the SLO's limits (a request of one output token has no ITL)."""
        if not self.done:
            return False
        itl = self.itl
        return (
            self.ttft <= slo.limit("ttft") and self.e2e <= slo.limit("e2e") and (itl is None or itl <= slo.limit("itl"))
        )


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p90, p99 of `values` (None when there are none)."""
    a = np.asarray(values, dtype=np.float64)
    return {f"p{q}": (float(np.percentile(a, q)) if a.size else None) for q in (50, 90, 99)}


@dataclass(frozen=True)
class Latencies:
    """TTFT, ITL and E2E of a set of requests (seconds), by percentile."""

    ttft: np.ndarray
    itl: np.ndarray
    e2e: np.ndarray

    @classmethod
    def of(cls, records: Sequence[FleetRecord]) -> Latencies:
        done = [r for r in records if r.done]
        itl = [x for r in done if (x := r.itl) is not None]
        return cls(np.array([r.ttft for r in done]), np.array(itl), np.array([r.e2e for r in done]))

    def at(self, metric: str, q: float) -> float | None:
        a = getattr(self, metric)
        return float(np.percentile(a, q)) if a.size else None

    def to_dict(self) -> dict[str, dict[str, float | None]]:
        return {m: percentiles(getattr(self, m).tolist()) for m in SLO_METRICS}


@dataclass(frozen=True)
class ReplicaSummary:
    """One replica's share of a fleet run: its role, the requests it served,
    its own simulator result (pages, prompt hit rate, steps) and, for a decode
    replica, the peak pages per group of the transfers in flight to it."""

    index: int
    role: str  # "aggregated", "prefill" or "decode"
    requests: int
    prompt_tokens: int
    result: SimResult
    transfer_peak_pages: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        out: dict[str, Any] = {
            "replica": self.index,
            "role": self.role,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "prompt_hit_rate": r.prompt_hit_rate,
            "preemptions": r.preemptions,
            "steps": r.steps,
            "pages": {g: {"total": u.total, "peak_used": u.peak_used} for g, u in r.pages.items()},
        }
        if self.role == "decode":
            out["transfer_peak_pages"] = dict(self.transfer_peak_pages)
        return out


@dataclass(frozen=True)
class FleetResult:
    """A fleet's run: every request's record, every replica's summary, the
    router(s), and what the fleet as a whole measured (module docstring)."""

    layout: str  # e.g. "4 x tp1, router kv" or "2 prefill + 2 decode x tp1"
    records: tuple[FleetRecord, ...]
    replicas: tuple[ReplicaSummary, ...]
    gpus: int
    slo: Slo | None = None

    @property
    def latencies(self) -> Latencies:
        return Latencies.of(self.records)

    @property
    def finished(self) -> int:
        return sum(r.done for r in self.records)

    @property
    def rejected(self) -> int:
        """Requests rejected, too long ones included."""
        return sum(r.rejected for r in self.records)

    @property
    def too_long(self) -> int:
        """Requests rejected unrouted: their prompt leaves no room under max_seq_len."""
        return sum(r.too_long for r in self.records)

    @property
    def makespan_s(self) -> float:
        ends = [r.finish_s for r in self.records if r.finish_s is not None and not r.rejected]
        return max(ends) - min(r.arrival_s for r in self.records) if ends else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        span = self.makespan_s
        return sum(r.output_len for r in self.records if r.done) / span if span > 0 else 0.0

    @property
    def prompt_hit_rate(self) -> float:
        """Prompt tokens served from cache over all prompt tokens of the
        requests served, at each request's first admission on the replica that
        computed its prompt (the prefill replicas when disaggregated): the
        replicas' own records summed, so a fleet of one is its replica."""
        computing = [r for s in self.replicas if s.role != "decode" for r in s.result.requests]
        tokens = sum(r.prompt_len for r in computing)
        return sum(r.cached_tokens for r in computing) / tokens if tokens else 0.0

    def good(self, slo: Slo | None = None) -> int:
        """Requests that met `slo` (the run's own when None; every finished one without an SLO)."""
        slo = slo or self.slo
        return self.finished if slo is None else sum(r.meets(slo) for r in self.records)

    def goodput(self, slo: Slo | None = None) -> float:
        """Good requests per second of the run."""
        span = self.makespan_s
        return self.good(slo) / span if span > 0 else 0.0

    def misses(self, slo: Slo | None = None) -> list[str]:
        """The SLO's bounds the fleet's percentiles miss, each as `ttft_p99 3.1 s > 2 s`,
        over the requests it served; a request a replica rejected (more pages than
        it holds) is a miss of its own. Requests too long for max_seq_len are
        the configuration's, not the fleet's: left out."""
        slo = slo or self.slo
        if slo is None:
            return []
        refused = self.rejected - self.too_long
        if refused:
            return [f"{refused} requests rejected (more pages than a replica holds)"]
        lat = self.latencies
        out = []
        for b in slo.bounds:
            v = lat.at(b.metric, b.quantile)
            if v is not None and v > b.seconds:
                out.append(f"{b.name} {v:.3g} s > {b.seconds:g} s")
        return out

    def meets(self, slo: Slo | None = None) -> bool:
        return not self.misses(slo)

    def imbalance(self, role: str | None = None) -> float:
        """Load imbalance of the replicas of `role` (all when None): the most
        prompt tokens any one of them computed (its served requests' prompt
        tokens less their prefix hits; on a decode replica, the handed-off
        tokens it did not hold already) over their mean; 1.0 is perfectly even."""
        work = [
            sum(r.prompt_len - r.cached_tokens for r in s.result.requests)
            for s in self.replicas
            if role is None or s.role == role
        ]
        mean = sum(work) / len(work) if work else 0.0
        return max(work) / mean if mean > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        roles = sorted({s.role for s in self.replicas})
        out: dict[str, Any] = {
            "layout": self.layout,
            "gpus": self.gpus,
            "requests": len(self.records),
            "finished": self.finished,
            "rejected": self.rejected,
            "too_long": self.too_long,
            "makespan_s": self.makespan_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "prompt_hit_rate": self.prompt_hit_rate,
            "latency_s": self.latencies.to_dict(),
            "imbalance": {role: self.imbalance(role) for role in roles},
            "replicas": [s.to_dict() for s in self.replicas],
        }
        if self.slo is not None:
            out["slo"] = {
                "slo": str(self.slo),
                "good_requests": self.good(),
                "goodput_rps": self.goodput(),
                "met": self.meets(),
                "misses": self.misses(),
            }
        return out
