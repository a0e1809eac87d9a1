"""Pool sizes that can move at run time, emulated with ballast dummies.

`KVCacheManager` has no call that resizes a pool, so `BallastPools` builds the
manager with pools large enough for any split in `[low, high]` and holds the
pages outside the current split with dummy requests (`add_dummy_requests` /
`free`, public methods only). A context dummy of t tokens holds
`ceil(t / tpb)` pages in both groups; a generation dummy of t tokens holds
`ceil(t / tpb)` full pages but only its window's pages in the sliding group;
together they hold any (sliding, full) ballast with full >= sliding, which the
oversized full pool guarantees.

Safety, by construction:

- ballast only ever takes **free** pages: a pool never shrinks below its live
  pages plus reservations (padding dummies), and no running request is
  suspended or preempted by a move;
- a move is clamped before it is laid: the shrinking pool gives up at most the
  pages free now, and the growing pool gets at most what keeps the bytes of
  both pools within the budget; a layout that would still exceed the budget is
  undone (the previous ballast is laid again), so a move is all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.cache import KVCacheManager
from kvpool.errors import KvpoolError
from kvpool.plan.result import PoolPlan
from kvpool.spec import ModelSpec, pages_needed


class RebalanceError(KvpoolError, ValueError):
    """A model or setting the rebalancer cannot handle."""


def split_groups(spec: ModelSpec) -> tuple[str, str]:
    """(sliding, full) group names; RebalanceError for other models."""
    kinds = {g.kind: g.name for g in spec.groups}
    if len(spec.groups) != 2 or set(kinds) != {"sliding", "full"}:
        raise RebalanceError(
            f"rebalance handles one sliding and one full group; {spec.name} has "
            f"{', '.join(g.kind for g in spec.groups)}"
        )
    return kinds["sliding"], kinds["full"]


def pages_for_share(plan: PoolPlan, group: str, share: float) -> dict[str, int]:
    """Whole pages per group when `group` gets `share` of the plan's budget
    (rounded down: the bytes never exceed `plan.budget_bytes`)."""
    s, f = split_groups(plan.spec)
    other = f if group == s else s
    gb, ob = plan.group(group).page_bytes, plan.group(other).page_bytes
    return {group: int(plan.budget_bytes * share // gb), other: int(plan.budget_bytes * (1 - share) // ob)}


@dataclass
class BallastPools:
    """Pool sizes emulated by ballast dummies on an oversized manager."""

    manager: KVCacheManager
    sliding: str
    full: str
    totals: dict[str, int]  # pages the manager was built with
    page_bytes: dict[str, int]
    budget_bytes: int
    units: list[tuple[int, int, bool]] = field(default_factory=list)  # (rid, tokens, is_gen)
    held: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, plan: PoolPlan, *, low: float, high: float, enable_reuse: bool) -> BallastPools:
        """A manager whose pools can hold any sliding share in [low, high] of
        `plan.budget_bytes`, its ballast laid for `plan`'s own split."""
        s, f = split_groups(plan.spec)
        lo, hi = pages_for_share(plan, s, low), pages_for_share(plan, s, high)
        g = plan.spec.groups[plan.spec.group_names.index(s)]
        gen = plan.limits.max_seq_len
        a = -(-gen // plan.spec.tokens_per_block)
        b = pages_needed(g, gen + plan.limits.num_extra_kv_tokens, gen - 1)
        # full ballast >= sliding ballast + the generation dummies' sliding pages
        span = hi[s] - lo[s]
        margin = (span + lo[f]) * b // max(a - b, 1) + 2 * b + 2
        totals = {s: hi[s] + margin, f: lo[f] + span + margin}
        mgr = KVCacheManager(
            PoolPlan.from_pages(plan.spec, totals, plan.limits, policy="rebalance"), enable_reuse=enable_reuse
        )
        pools = cls(mgr, s, f, totals, {gp.name: gp.page_bytes for gp in plan.groups}, plan.budget_bytes)
        pools.held = {s: 0, f: 0}
        start = {gp.name: gp.pages for gp in plan.groups}
        pools.relay({k: totals[k] - start[k] for k in totals})
        if pools.sizes() != start and pools.bytes_now() > pools.budget_bytes:  # pragma: no cover - all pages free
            raise RebalanceError(f"could not lay the ballast for {start}")
        return pools

    def size(self, group: str) -> int:
        """Pages the pool has now (its total less the ballast)."""
        return self.totals[group] - self.held[group]

    def sizes(self) -> dict[str, int]:
        return {g: self.size(g) for g in self.totals}

    def bytes_now(self) -> int:
        return sum(self.size(g) * self.page_bytes[g] for g in self.totals)

    def share(self, group: str) -> float:
        return self.size(group) * self.page_bytes[group] / self.bytes_now()

    def clamp(self, target: dict[str, int]) -> dict[str, int]:
        """The sizes nearest `target` that one move can reach now: a pool
        shrinks by at most its free pages, and grows by at most what keeps both
        pools' bytes within the budget."""
        out = {g: max(target[g], self.size(g) - self.manager.free_pages(g)) for g in self.totals}
        for g in self.totals:
            if out[g] > self.size(g):  # growing: what the other pool's bytes leave
                other = self.full if g == self.sliding else self.sliding
                room = (self.budget_bytes - out[other] * self.page_bytes[other]) // self.page_bytes[g]
                out[g] = max(min(out[g], room), self.size(g))
        return out

    def set_sizes(self, target: dict[str, int]) -> tuple[dict[str, int], bool]:
        """Move towards `target` pages per group as far as free pages and the
        budget allow (`clamp`), all or nothing. Returns the pages each pool
        gained (negative: gave up), and whether `target` was within reach."""
        before = self.sizes()
        want = self.clamp(target)
        reached = want == target
        if want == before:
            return {g: 0 for g in before}, reached
        old = [(t, gen) for _, t, gen in self.units]
        self.relay({g: self.totals[g] - want[g] for g in self.totals})
        if self.bytes_now() > self.budget_bytes:
            self._clear()
            for tokens, gen in old:
                if not self._add(tokens, gen):  # pragma: no cover - the pages it held are free
                    raise RebalanceError("could not restore the ballast")
        return {g: self.size(g) - before[g] for g in before}, reached

    def relay(self, hold: dict[str, int]) -> None:
        """Replace the ballast with one holding at least `hold` pages per
        group where the free pages allow (a few pages more where whole
        dummies overshoot)."""
        self._clear()
        s, f = self.sliding, self.full
        # generation dummies first, for the full-over-sliding excess
        while (extra := (hold[f] - self.held[f]) - max(hold[s] - self.held[s], 0)) > 0:
            tokens = self._gen_tokens(extra)
            if tokens is None or not self._add(tokens, True):
                break
        # then context dummies, which hold the same pages in both groups
        while (left := max(hold[s] - self.held[s], hold[f] - self.held[f])) > 0:
            tokens = self._ctx_tokens(left)
            while tokens >= 1 and not self._add(tokens, False):
                tokens //= 2
            if tokens < 1:
                break

    def _gen_tokens(self, extra: int) -> int | None:
        """The shortest generation dummy whose full-over-sliding excess is at
        least `extra` (or the longest one), None when none has any."""
        top = self.manager.limits.max_seq_len
        most = self._gen_excess(top)
        if most <= 0:
            return None
        lo, hi = 1, top
        while lo < hi:  # the excess does not fall as the dummy grows
            mid = (lo + hi) // 2
            if self._gen_excess(mid) >= min(extra, most):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _gen_excess(self, tokens: int) -> int:
        """Full pages over sliding pages of a generation dummy of `tokens`."""
        cap = tokens + self.manager.limits.num_extra_kv_tokens
        gs = next(g for g in self.manager.groups if g.name == self.sliding)
        return -(-cap // self.manager.tokens_per_block) - pages_needed(gs, cap, tokens - 1)

    def _ctx_tokens(self, pages: int) -> int:
        """A context dummy holding `pages` pages per group (capped at max_seq_len)."""
        lim = self.manager.limits
        return max(min(pages * self.manager.tokens_per_block, lim.max_seq_len) - lim.num_extra_kv_tokens, 1)

    def _add(self, tokens: int, is_gen: bool) -> bool:
        dummy = self.manager.add_dummy_requests(1, tokens, is_gen=is_gen)
        if not dummy:
            return False
        rid = dummy.ids[0]
        self.units.append((rid, tokens, is_gen))
        for g in (self.sliding, self.full):
            self.held[g] += self.manager.live_pages(rid, g)
        return True

    def _clear(self) -> None:
        for rid, _, _ in self.units:
            self.manager.free(rid)
        self.units, self.held = [], {g: 0 for g in self.totals}
