"""Model-family sizing rules. The generic path knows none of them (docs/design.md, rule 4):
a family adds its own typical length and constraints here, keyed by
`ModelSpec.family`.
"""

from __future__ import annotations

from typing import Literal, Protocol

from kvpool.plan.batches import Constraint, generation_dummy, minimal_decode
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
    """One generation dummy of max_seq_len tokens `(L + d + E, L - 1)` plus
    `batch_size - 1` minimal decodes of `1 + d + E` positions: the CUDA-graph
    warmup batch padded around the longest request, exactly as warmup allocates
    it (its drafts and extra KV tokens lie past L and need pages too)."""
    longest = generation_dummy(limits.max_seq_len, limits)
    return (longest,) + (minimal_decode(limits),) * (batch_size - 1)


class DeepSeekV4Rules:
    """DeepSeek-V4 keeps the max-length model: S falls back to L, and the longest
    decode plus `B - 1` short requests must always fit, so that its ageless
    compressed pools never starve the window pool during warmup. The profile
    phase needs nothing more: its generic `graph_longest` shape is this batch
    at the largest CUDA-graph batch size, which is what warmup runs."""

    name = "deepseek_v4"

    def typical_seq_len(self, limits: ServingLimits) -> int | None:
        return limits.avg_seq_len or limits.max_seq_len

    def constraints(self, limits: ServingLimits, phase: Phase) -> tuple[Constraint, ...]:
        if phase == "profile":
            return ()
        return (Constraint("longest_decode", longest_decode_batch(limits, limits.max_batch_size)),)


_RULES: dict[str, FamilyRules] = {"deepseek_v4": DeepSeekV4Rules()}


def rules_for(spec: ModelSpec) -> FamilyRules:
    """The sizing rules of `spec`'s family (generic when it has none)."""
    return _RULES.get(spec.family, GenericRules())
