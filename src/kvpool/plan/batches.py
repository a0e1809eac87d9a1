"""The batches a plan is derived from: the reference request, the typical step,
and the generic constraints. Pure functions of the limits; each returns a tuple
of `Shape`s (capacity, history) for `kvpool.spec.pages` to count."""

from __future__ import annotations

from typing import NamedTuple

from kvpool.plan.limits import ServingLimits
from kvpool.spec import Shape
from kvpool.spec.pages import REFERENCE_REQUEST as REFERENCE_REQUEST  # re-exported: the plan layer's name for it


class Constraint(NamedTuple):
    """A batch that must fit at once: its pages in every group are a floor."""

    name: str
    batch: tuple[Shape, ...]


def reference_batch() -> tuple[Shape, ...]:
    """The default ratio batch: one reference request."""
    return (REFERENCE_REQUEST,)


def decode_shape(length: int, limits: ServingLimits) -> Shape:
    """A request of `length` total positions in a decode step: the last `1 + d`
    positions (input token plus drafts) are in flight, the rest is history."""
    return Shape(length, max(0, length - limits.max_draft_len - 1))


def minimal_decode(limits: ServingLimits) -> Shape:
    """The smallest decode (a CUDA-graph padding dummy): no history, one input
    token plus d drafts plus E extra KV tokens (docs/design.md, rule 2)."""
    return Shape(limits.headroom, 0)


def context_shape(limits: ServingLimits, fallback_len: int) -> Shape:
    """One fresh context request of the per-iteration token budget N (or
    `fallback_len` when there is none) plus the E extra KV tokens."""
    return Shape((limits.max_num_tokens or fallback_len) + limits.num_extra_kv_tokens, 0)


def typical_step(limits: ServingLimits, avg_seq_len: int) -> tuple[Shape, ...]:
    """One context request of `(N or S) + E` positions plus `B - 1` decodes at S.

    >>> typical_step(ServingLimits(max_batch_size=3, max_seq_len=1024,
    ...                            max_num_tokens=2048, max_draft_len=2), 1024)
    (Shape(capacity=2048, history=0), Shape(capacity=1024, history=1021), Shape(capacity=1024, history=1021))
    """
    decode = decode_shape(avg_seq_len, limits)
    return (context_shape(limits, avg_seq_len),) + (decode,) * (limits.max_batch_size - 1)


def context_constraint(limits: ServingLimits) -> Constraint | None:
    """The generic chunked-prefill constraint: one iteration's token budget as
    the engine's warmup runs it, `[(N + 1 + d + E, 0)]` (`warmup_context`: N
    prompt tokens, the first generated token and d drafts, plus E); None
    without a token budget. A floor of only `(N + E, 0)` left the final pools
    one page short of that warmup whenever N + E ends a page."""
    context = warmup_context(limits)
    return None if context is None else Constraint("context", (context,))


def generation_dummy(token_num: int, limits: ServingLimits) -> Shape:
    """A warmup generation dummy of `token_num` (history plus the current input
    token): capacity `token_num + d + E`, history `token_num - 1` (docs/design.md,
    rule 2: the current input is inside `token_num`, not counted again)."""
    return Shape(token_num + limits.max_draft_len + limits.num_extra_kv_tokens, token_num - 1)


def warmup_context(limits: ServingLimits) -> Shape | None:
    """The context warmup dummy: N prompt tokens, the first generated token and
    d drafts, plus E: `(N + 1 + d + E, 0)`; None without a token budget."""
    if limits.max_num_tokens is None:
        return None
    return Shape(limits.max_num_tokens + limits.headroom, 0)


def guarantees(limits: ServingLimits) -> tuple[Constraint, ...]:
    """What a final plan holds whenever its budget can (docs/plan.md,
    "Guarantees"): the two warmup shapes the engine runs on the final pools
    (the context dummy and the general batch of B minimal decodes: either
    failing fails the engine's start) and one request decoding at max_seq_len
    (`decode_shape(L)`, the shape `max_concurrency` counts). Floors that never
    raise: one the budget cannot hold is reported with the smallest change that
    would (`plan.advice`)."""
    warm = warmup_constraints(limits)[:-1]  # without graph_longest: a graph that does not fit runs eagerly
    return warm + (Constraint("max_seq_len", (decode_shape(limits.max_seq_len, limits),)),)


def warmup_constraints(limits: ServingLimits) -> tuple[Constraint, ...]:
    """The shapes warmup runs, one after another (so each is a floor of its own):
    the context dummy, the general warmup batch of B minimal decodes, and the
    largest CUDA-graph batch padded around one dummy of max_seq_len tokens (the
    longest decode a captured graph is warmed up with; smaller graph batches
    are subsets of it)."""
    minimal = minimal_decode(limits)
    context = warmup_context(limits)
    out = [Constraint("warmup_context", (context,))] if context else []
    out.append(Constraint("warmup_batch", (minimal,) * limits.max_batch_size))
    longest = generation_dummy(limits.max_seq_len, limits)
    out.append(Constraint("graph_longest", (longest,) + (minimal,) * (limits.largest_graph_batch - 1)))
    return tuple(out)
