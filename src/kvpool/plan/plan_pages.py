"""`PlanPages`: a plan's pools as bare page counts, so the warmup dry run of
`plan.capture` runs on a plan without a manager (for the plan's warnings)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvpool.plan.capture import Rows, WarmupReport, dummy_shape, warmup
from kvpool.plan.limits import ServingLimits
from kvpool.plan.result import PoolPlan
from kvpool.spec.groups import LayerGroup
from kvpool.spec.pages import pages_needed


class PlanPages:
    """A plan's pools as an empty cache without reuse sees them: free pages per
    group, and dummies that take `pages_needed` pages each (what the manager's
    page tables hold for a dummy; tests/test_plan_capture.py checks that the
    warmup on this equals the manager's). Mutated only by its own methods."""

    def __init__(self, plan: PoolPlan) -> None:
        self._plan = plan
        self._free = plan.pool_pages()  # by pool: groups sharing a pool share its pages
        self._live: dict[int, tuple[dict[str, int], dict[str, int]]] = {}  # rid -> (pages by group, by pool)
        self._next = -1
        self._padding: dict[int, int] = {}

    @property
    def groups(self) -> Sequence[LayerGroup]:
        return self._plan.spec.groups

    @property
    def limits(self) -> ServingLimits:
        return self._plan.limits

    def free_pages(self, group: str) -> int:
        return self._free[self._plan.pool_of(group)]

    def pool_of(self, group: str) -> str:
        return self._plan.pool_of(group)

    def live_pages(self, rid: int, group: str) -> int:
        return self._live[rid][0][group]

    def add_dummy_requests(self, batch_size: int, token_num: int, draft_len: int = 0, is_gen: bool = True) -> Rows:
        cap, hist = dummy_shape(token_num, draft_len, self.limits.num_extra_kv_tokens, is_gen)
        each = {g.name: pages_needed(g, cap, hist) for g in self.groups}
        pooled: dict[str, int] = {}
        for k, n in each.items():
            pooled[self.pool_of(k)] = pooled.get(self.pool_of(k), 0) + n
        short = {k: batch_size * n - self._free[k] for k, n in pooled.items() if batch_size * n > self._free[k]}
        if short:
            return Rows(short=short)
        ids = tuple(range(self._next, self._next - batch_size, -1))
        self._live.update(dict.fromkeys(ids, (each, pooled)))  # shared: neither dict changes after this
        self._next -= batch_size
        for k, n in pooled.items():
            self._free[k] -= batch_size * n
        return Rows(ids)

    def reserve_padding_dummy(self, draft_len: int = 0) -> int | None:
        if draft_len not in self._padding:
            rows = self.add_dummy_requests(1, 1, draft_len)
            if not rows:
                return None
            self._padding[draft_len] = rows.ids[0]
        return self._padding[draft_len]

    def free(self, rid: int) -> None:
        for k, n in self._live.pop(rid)[1].items():
            self._free[k] += n


def plan_warmup(plan: PoolPlan, draft_lens: Iterable[int] | None = None) -> WarmupReport:
    """The warmup dry run on `plan`'s pages, without a manager: the same report
    `KVCacheManager(plan, enable_reuse=False).warmup(...)` gives on an empty
    cache. Draft lengths default to 0 and `max_draft_len` (as `kvpool warmup`)."""
    drafts = sorted({0, plan.limits.max_draft_len}) if draft_lens is None else sorted(set(draft_lens))
    return warmup(PlanPages(plan), plan.limits.graph_batch_sizes, drafts)
