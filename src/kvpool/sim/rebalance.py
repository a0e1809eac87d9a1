"""Online rebalancing of a sliding + full split (the `rebalance` policy).

TensorRT-LLM's V2 KV cache manager can re-split its pools while serving: it
keeps an exponential moving average of request lengths and re-plans when a
pool's current size leaves a band around its target, after a cooldown. This
module does the same, safely, with only the public `KVCacheManager` methods:

- **Pools as ballast.** `KVCacheManager` has no call that resizes a pool, so
  the manager is built with pools large enough for any split in
  `[low, high]`, and the pages outside the current split are held by dummy
  requests (`add_dummy_requests` / `free`). A context dummy of one page holds
  one page in both groups; a generation dummy of n tokens holds
  `ceil(n / tpb)` full pages but only its window's pages in the sliding group;
  together they hold any (sliding, full) excess (`BallastPools`).
- **Never below live pages.** Shrinking a pool means adding ballast, which
  only takes free pages: a pool never shrinks below its live pages plus
  reservations, and no running request is suspended. A shrink that does not
  fit yet is done as far as it fits (and retried at the next check).
- **Policy** (`Rebalancer`): every admitted request updates an EMA (weight
  `alpha`) of its bytes x steps per group (`kvpool.plan.occupancy`); every
  `check_every` steps, once `cooldown` steps have passed since the last move,
  when a group's current/target share leaves `(1/band, band)` (1.25), the
  split moves to the target. `dry_run` only records what it would move.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.cache import KVCacheManager
from kvpool.errors import KvpoolError
from kvpool.plan.occupancy import Occupancy
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
    """Whole pages per group when `group` gets `share` of the plan's budget."""
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
    units: list[tuple[int, int, bool]] = field(default_factory=list)  # (rid, tokens, is_gen)
    held: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, plan: PoolPlan, *, low: float, high: float, enable_reuse: bool) -> BallastPools:
        """A manager whose pools can hold any sliding share in [low, high]."""
        s, f = split_groups(plan.spec)
        lo, hi = pages_for_share(plan, s, low), pages_for_share(plan, s, high)
        g = plan.spec.groups[plan.spec.group_names.index(s)]
        tpb, window = plan.spec.tokens_per_block, g.window or 0
        gen = plan.limits.max_seq_len
        a, b = -(-gen // tpb), pages_needed(g, gen, gen - 1)
        # the most full-over-sliding ballast ever needed, and its sliding pages
        span = (hi[s] - lo[s]) + (lo[f] - hi[f])
        margin_s = span * b // max(a - b, 1) + 2 * (-(-(window + tpb) // tpb)) + 2
        totals = {s: hi[s] + margin_s, f: lo[f] + margin_s + (hi[s] - lo[s])}
        mgr = KVCacheManager(
            PoolPlan.from_pages(plan.spec, totals, plan.limits, policy="rebalance"), enable_reuse=enable_reuse
        )
        page_bytes = {gp.name: gp.page_bytes for gp in plan.groups}
        return cls(mgr, s, f, totals, page_bytes, [], {s: 0, f: 0})

    def size(self, group: str) -> int:
        """Pages the pool has now (its total less the ballast)."""
        return self.totals[group] - self.held[group]

    def _add(self, tokens: int, is_gen: bool) -> bool:
        dummy = self.manager.add_dummy_requests(1, tokens, is_gen=is_gen)
        if not dummy:
            return False
        rid = dummy.ids[0]
        self.units.append((rid, tokens, is_gen))
        for g in (self.sliding, self.full):
            self.held[g] += self.manager.live_pages(rid, g)
        return True

    def _gen_excess(self, tokens: int) -> int:
        """Full pages over sliding pages of a generation dummy of `tokens`."""
        lim = self.manager.limits
        cap = tokens + lim.num_extra_kv_tokens
        gs = next(g for g in self.manager.groups if g.name == self.sliding)
        return -(-cap // self.manager.tokens_per_block) - pages_needed(gs, cap, tokens - 1)

    def _lay(self, want: dict[str, int]) -> None:
        """Add ballast towards `want` held pages per group, as far as it fits."""
        s, f, tpb = self.sliding, self.full, self.manager.tokens_per_block
        top = self.manager.limits.max_seq_len
        while (extra := (want[f] - self.held[f]) - (want[s] - self.held[s])) > 0:
            tokens = top  # the longest dummy whose excess does not overshoot
            while tokens > tpb and self._gen_excess(tokens) > extra:
                tokens -= tpb
            if self._gen_excess(tokens) <= 0 or not self._add(tokens, True):
                break
        while (left := min(want[s] - self.held[s], want[f] - self.held[f])) > 0:
            tokens = min(left * tpb, top) - self.manager.limits.num_extra_kv_tokens
            while tokens >= 1 and not self._add(tokens, False):
                tokens //= 2
            if tokens < 1:
                break

    def bytes_now(self) -> int:
        return sum(self.size(g) * self.page_bytes[g] for g in self.totals)

    def set_sizes(self, target: dict[str, int], budget_bytes: int) -> dict[str, int]:
        """Re-lay the ballast so the pools come as close to `target` as free
        pages allow (live pages are never touched). A layout over
        `budget_bytes` is undone (the old one is laid again; it fits, as the
        free pages are those it left). Returns pages moved per group (positive:
        the pool grew)."""
        before = {g: self.size(g) for g in self.totals}
        old = [(t, gen) for _, t, gen in self.units]
        self._clear()
        self._lay({g: max(self.totals[g] - target[g], 0) for g in self.totals})
        if self.bytes_now() > budget_bytes:
            self._clear()
            for tokens, gen in old:
                if not self._add(tokens, gen):  # pragma: no cover - the pages it held are free
                    raise RebalanceError("could not restore the ballast")
        return {g: self.size(g) - before[g] for g in self.totals}

    def _clear(self) -> None:
        for rid, _, _ in self.units:
            self.manager.free(rid)
        self.units, self.held = [], {g: 0 for g in self.totals}


@dataclass
class Rebalancer:
    """When and where to move the split (module docstring)."""

    spec: ModelSpec
    limits_max_seq_len: int
    budget_bytes: int
    page_bytes: dict[str, int]
    alpha: float = 0.02
    band: float = 1.25
    cooldown: int = 256
    check_every: int = 16
    low: float = 0.02
    high: float = 0.98
    ema: dict[str, float] = field(default_factory=dict)
    last_move: int = -(10**9)

    def observe(self, prompt: int, output: int) -> None:
        """An admitted request: fold its bytes x steps per group into the EMA."""
        from kvpool.plan import ServingLimits

        lim = ServingLimits(max_seq_len=self.limits_max_seq_len)
        prompt = min(prompt, self.limits_max_seq_len - 1)
        pages = Occupancy([(prompt, output)]).expected_pages(self.spec, lim)
        for g, p in pages.items():
            b = p * self.page_bytes[g]
            self.ema[g] = b if g not in self.ema else (1 - self.alpha) * self.ema[g] + self.alpha * b

    def target_share(self, group: str) -> float | None:
        total = sum(self.ema.values())
        if not total:
            return None
        return min(max(self.ema[group] / total, self.low), self.high)

    def due(self, step: int, group: str, share_now: float) -> float | None:
        """The target share when a move is due at `step`, else None."""
        if step % self.check_every or step - self.last_move < self.cooldown:
            return None
        target = self.target_share(group)
        if target is None:
            return None
        ratios = (share_now / target, (1 - share_now) / (1 - target))
        return target if any(not 1 / self.band < r < self.band for r in ratios) else None
