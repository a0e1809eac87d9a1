"""When and where to move a sliding + full split online (the `rebalance` policy).

TensorRT-LLM's V2 KV cache manager can re-split its pools while serving: it
keeps an exponential moving average of request lengths and re-plans when a
pool's current/target ratio leaves a band, after a cooldown. `Rebalancer`
does the same with the analytical model of the `occupancy` policy
(`kvpool.plan.occupancy`, pages x steps in flight per group, prefill chunks
included) applied to the EMA of recently admitted requests:

- every admitted request folds its expected bytes x steps per group into an
  EMA of weight `alpha` (per request). Its output length is not known at
  admission in a real engine, so it is estimated by an EMA of the outputs of
  finished requests (`learn_outputs`; `first_output` until one has finished);
- every `check_every` steps, once `cooldown` steps have passed since the last
  move, when either group's current/target share leaves `(1/band, band)`, a
  move to the target starts. The target share is the EMA's bytes share,
  clipped to `[low, high]`.

How a move is carried out safely (only free pages, within the budget, all or
nothing per step, no request suspended) is `kvpool.sim.ballast`; the loop that
drains a shrinking pool step by step is `kvpool.sim.rebalance_sim`.

The defaults (alpha 0.05, cooldown 64 steps) were the best of a small grid on
the shifting trace of docs/sim.md (larger alphas oscillate); the band, 1.25,
is TensorRT-LLM's. The cooldown is in steps, 2 to 3 s of simulated time there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.plan.occupancy import Occupancy
from kvpool.plan.result import PoolPlan
from kvpool.sim.ballast import RebalanceError, pages_for_share, split_groups

__all__ = ["RebalanceError", "Rebalancer", "pages_for_share", "split_groups"]


@dataclass
class Rebalancer:
    """The move policy (module docstring). Side effects: `observe` and
    `finished` update the EMAs; `due` records the step of a move it starts."""

    plan: PoolPlan
    alpha: float = 0.05
    band: float = 1.25
    cooldown: int = 64
    check_every: int = 16
    low: float = 0.02
    high: float = 0.98
    learn_outputs: bool = True
    first_output: int = 256
    output_alpha: float = 0.05
    ema: dict[str, float] = field(default_factory=dict)
    output_ema: float | None = None
    last_move: int = -(10**9)

    def __post_init__(self) -> None:
        split_groups(self.plan.spec)  # refuses other models by name
        if not 0 < self.alpha <= 1 or not 0 < self.output_alpha <= 1:
            raise RebalanceError(f"EMA weights must lie in (0, 1], got {self.alpha}, {self.output_alpha}")
        if self.band <= 1 or self.cooldown < 0 or self.check_every < 1:
            raise RebalanceError("rebalance needs band > 1, cooldown >= 0 and check_every >= 1")
        if not 0 < self.low < self.high < 1:
            raise RebalanceError(f"rebalance shares need 0 < low < high < 1, got {self.low}, {self.high}")

    def expected_output(self, given: int) -> int:
        """The output length assumed for a request admitted now."""
        if not self.learn_outputs:
            return given
        return max(1, round(self.output_ema if self.output_ema is not None else self.first_output))

    def observe(self, prompt: int, output: int) -> None:
        """An admitted request (`output`: its limit, used unless outputs are
        learned): fold its bytes x steps per group into the EMA."""
        limits = self.plan.limits
        prompt = min(prompt, limits.max_seq_len - 1)
        out = min(self.expected_output(output), limits.max_seq_len - prompt)
        pages = Occupancy([(prompt, out)]).expected_pages(self.plan.spec, limits)
        for g, p in pages.items():
            b = p * self.plan.group(g).page_bytes
            self.ema[g] = b if g not in self.ema else (1 - self.alpha) * self.ema[g] + self.alpha * b

    def finished(self, output: int) -> None:
        """A request finished after `output` tokens: the output-length EMA."""
        e = self.output_ema
        self.output_ema = float(output) if e is None else (1 - self.output_alpha) * e + self.output_alpha * output

    def target_share(self, group: str) -> float | None:
        """`group`'s share of the EMA's bytes, clipped to [low, high]; None
        before any request was observed."""
        total = sum(self.ema.values())
        if not total:
            return None
        return min(max(self.ema[group] / total, self.low), self.high)

    def due(self, step: int, group: str, share_now: float) -> float | None:
        """The target share of `group` when a move is due at `step` (and then
        counts `step` as the last move), else None."""
        if step % self.check_every or step - self.last_move < self.cooldown:
            return None
        target = self.target_share(group)
        if target is None:
            return None
        ratios = (share_now / target, (1 - share_now) / (1 - target))
        if all(1 / self.band < r < self.band for r in ratios):
            return None
        self.last_move = step
        return target
