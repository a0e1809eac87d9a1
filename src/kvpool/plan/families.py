"""Model-family sizing rules. The generic path knows none of them (docs/design.md, rule 4):
a family adds its own typical length and constraints here, keyed by
`ModelSpec.family`.
"""

from __future__ import annotations

from typing import Literal, Protocol

from kvpool.plan.batches import Constraint, minimal_decode
from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec, Shape

Phase = Literal["final", "profile"]


class FamilyRules(Protocol):
    """What a model family adds to sizing."""

    name: str

    def typical_seq_len(self, limits: ServingLimits) -> int | None:
        """S for the typical step, or None to stay on the reference request."""
        ...

    def constraints(self, limits: ServingLimits, phase: Phase) -> tuple[Constraint, ...]:
        """Family-specific batches that must fit (on top of the generic ones)."""
        ...


class GenericRules:
    """Every model without a rule of its own: S only when the user gives it,
    and no family constraints."""

    name = "generic"

    def typical_seq_len(self, limits: ServingLimits) -> int | None:
        return limits.avg_seq_len

    def constraints(self, limits: ServingLimits, phase: Phase) -> tuple[Constraint, ...]:
        return ()


def longest_decode_batch(limits: ServingLimits, batch_size: int) -> tuple[Shape, ...]:
    """One decode at max length `(L, L - 1)` plus `batch_size - 1` minimal decodes
    of `1 + d + E` positions: a CUDA-graph warmup batch padded around the longest
    request."""
    longest = Shape(limits.max_seq_len, limits.max_seq_len - 1)
    return (longest,) + (minimal_decode(limits),) * (batch_size - 1)


class DeepSeekV4Rules:
    """DeepSeek-V4 keeps the max-length model: S falls back to L, and the longest
    decode plus `B - 1` short requests must always fit, so that its ageless
    compressed pools never starve the window pool during warmup. In the profile
    phase the batch is the largest CUDA-graph batch, which is what warmup runs."""

    name = "deepseek_v4"

    def typical_seq_len(self, limits: ServingLimits) -> int | None:
        return limits.avg_seq_len or limits.max_seq_len

    def constraints(self, limits: ServingLimits, phase: Phase) -> tuple[Constraint, ...]:
        batch = limits.largest_graph_batch if phase == "profile" else limits.max_batch_size
        return (Constraint("longest_decode", longest_decode_batch(limits, batch)),)


_RULES: dict[str, FamilyRules] = {"deepseek_v4": DeepSeekV4Rules()}


def rules_for(spec: ModelSpec) -> FamilyRules:
    """The sizing rules of `spec`'s family (generic when it has none)."""
    return _RULES.get(spec.family, GenericRules())
