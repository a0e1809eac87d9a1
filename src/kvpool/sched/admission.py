"""How much of its future a request must find room for before it is admitted.

Engines differ here more than anywhere in their schedulers, and it decides
whether they ever preempt:

- **optimistic** (vLLM; TensorRT-LLM's `MAX_UTILIZATION`): a request is
  admitted when its first prefill chunk fits; when decode later runs out of
  pages the most recently admitted requests are preempted and recomputed.
- **guaranteed** (TensorRT-LLM's default `GUARANTEED_NO_EVICT`, its
  `CapacitySchedulerPolicy`): a request is admitted only if the free pages
  hold what every running request still needs to finish (all of its
  remaining output) plus the whole of the new one. Nothing is ever evicted.
- **sglang** (SGLang's `PrefillAdder`): the new request reserves its prompt
  plus min(max_new_tokens, 4096) output tokens; each running request reserves
  `new_token_ratio` of its remaining output (min(remaining, 4096) x ratio).
  The ratio starts at 0.7, falls by (0.7 - 0.7 x 0.14) / 600 each step to
  0.098, and after a retraction is re-estimated as (tokens decoded + 20 per
  request) / (sum of max_new_tokens + 1) of the requests still running
  (sglang 0.5.23: srt/environ.py SGLANG_INIT_NEW_TOKEN_RATIO 0.7,
  SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
  600, SGLANG_RETRACT_DECODE_STEPS 20, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
  4096; managers/scheduler_components/new_token_ratio_tracker.py;
  managers/schedule_policy.py add_one_req, _get_running_request_total_token_offset).

Reserved pages are counted per pool with the one page arithmetic
(`spec.pages`): a request that ends at capacity C needs `pages_needed(g, C)`
in a full group, and at most `decode_worst_case_pages` in a window group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvpool.sched.paged_cache import PagedCache
from kvpool.sched.sequence import Sequence
from kvpool.spec import LayerGroup
from kvpool.spec.pages import decode_worst_case_pages, pages_needed

ADMISSIONS = ("optimistic", "guaranteed", "sglang")
SGLANG_INIT_RATIO = 0.7
SGLANG_MIN_FACTOR = 0.14
SGLANG_DECAY_STEPS = 600
SGLANG_RETRACT_STEPS = 20
SGLANG_CLIP = 4096


@dataclass
class Admission:
    """An admission rule (module docstring). `ratio` is the share of its
    remaining output a running request reserves (None: no reservation, the
    optimistic rule); `clip` caps one request's reserved output tokens."""

    name: str
    groups: tuple[LayerGroup, ...]
    ratio: float | None
    clip: int | None = None
    decay: float = 0.0
    floor: float = 0.0

    @classmethod
    def named(cls, name: str, groups: Iterable[LayerGroup]) -> Admission:
        """The rule called `name` (one of ADMISSIONS) over the pool groups
        `groups`; ValueError otherwise."""
        gs = tuple(groups)
        if name == "optimistic":
            return cls(name, gs, None)
        if name == "guaranteed":
            return cls(name, gs, 1.0)
        if name == "sglang":
            low = SGLANG_INIT_RATIO * SGLANG_MIN_FACTOR
            return cls(name, gs, SGLANG_INIT_RATIO, SGLANG_CLIP, (SGLANG_INIT_RATIO - low) / SGLANG_DECAY_STEPS, low)
        raise ValueError(f"unknown admission rule {name!r}; rules: {', '.join(ADMISSIONS)}")

    @property
    def reserves(self) -> bool:
        return self.ratio is not None

    def step(self) -> None:
        """One scheduling step passed without a preemption (SGLang decays its ratio)."""
        if self.ratio is not None and self.decay:
            self.ratio = max(self.ratio - self.decay, self.floor)

    def preempted(self, running: Iterable[Sequence]) -> None:
        """Requests were preempted; `running` are those left (SGLang re-estimates)."""
        if self.ratio is None or not self.decay:
            return
        rows = list(running)
        decoded = sum(len(s.output_ids) for s in rows) + SGLANG_RETRACT_STEPS * len(rows)
        self.ratio = min(1.0, decoded / (sum(s.max_new_tokens for s in rows) + 1))

    def _output(self, tokens: int, ratio: float) -> int:
        reserved = min(tokens, self.clip) if self.clip is not None else tokens
        return int(-(-max(reserved, 0) * ratio // 1))

    def fits(
        self,
        cache: PagedCache,
        running: Iterable[Sequence],
        seq: Sequence,
        *,
        reused: int,
        extra: int,
        taken: Mapping[str, int] | None = None,
    ) -> bool:
        """Whether the free pages hold the reservations of `running` and of the
        new `seq` (`reused` of its tokens found cached, its hit taking `taken`
        pages per pool from the free ones: `CreateCheck.taken`). No side effects."""
        if self.ratio is None:
            return True
        groups = self.groups
        need: Counter[str] = Counter()
        for s in running:
            cap = s.num_tokens + self._output(s.max_new_tokens - len(s.output_ids), self.ratio) + extra
            for g in groups:
                need[cache.pool_of(g.name)] += max(0, _peak(g, cap, extra) - cache.live_pages(s.rid, g.name))
        cap = seq.num_tokens + self._output(seq.max_new_tokens - len(seq.output_ids), 1.0) + extra
        for g in groups:
            need[cache.pool_of(g.name)] += max(0, _peak(g, cap, extra) - _peak(g, reused, extra))
        taken = taken or {}
        return all(n + taken.get(pool, 0) <= cache.free_pages(_member(groups, cache, pool)) for pool, n in need.items())


def _peak(g: LayerGroup, capacity: int, extra: int) -> int:
    """Most live pages a request of `capacity` positions holds in `g` while it
    decodes (window groups: their worst case, when smaller)."""
    full = pages_needed(g, capacity)
    worst = decode_worst_case_pages(g, 1 + extra)
    return full if worst is None else min(full, worst)


def _member(groups: tuple[LayerGroup, ...], cache: PagedCache, pool: str) -> str:
    return next(g.name for g in groups if cache.pool_of(g.name) == pool)
