"""The one page arithmetic (docs/design.md, rule 1).

Sizing, the capacity query, dummy allocation and run-time resizes all ask these
functions how many pages a request needs; nothing else in kvpool divides by
`tokens_per_block`. A request is described by `capacity` (positions that have
slots) and `history` (positions already computed, immutable); `capacity >=
history`. The token at position `history` is the one in flight.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kvpool.spec.groups import LayerGroup, ModelSpec


class Shape(NamedTuple):
    """One request of a batch, as the page arithmetic sees it."""

    capacity: int
    history: int = 0


# One request just past 2K tokens, in its first decode step: the shape the pool
# ratio comes from when nothing is known about the workload (docs/design.md, rule 4),
# and the one pipeline stages are compared at (spec/stages.py).
REFERENCE_REQUEST = Shape(2049, 2048)


def stale_pages(group: LayerGroup, history: int) -> int:
    """Leading pages no longer needed once `history` positions are computed
    (the group's kind rule says which: `spec.kinds`). sliding(W): the in-flight
    token at position `history` still attends to positions `history + 1 - W`
    onwards, so pages `[0, floor((history+1-W)/tpb))` are stale."""
    return group.rule.stale_pages(group, history)


def table_blocks(group: LayerGroup, capacity: int) -> int:
    """Entries of one request's block table in `group`, stale ones included:
    one per page-sized block of positions, `ceil(capacity/tpb)`; one slot for a
    per-request (`state`) group once the request has any capacity."""
    if capacity <= 0:
        return 0
    if group.rule.per_request:
        return 1
    return -(-capacity // group.tokens_per_block)


def pages_needed(group: LayerGroup, capacity: int, history: int = 0) -> int:
    """Live pages (slots) of one request in `group`: `table_blocks - stale`,
    i.e. `ceil(capacity/tpb) - stale`; one for a state group."""
    if capacity <= 0:
        return 0
    return table_blocks(group, capacity) - group.rule.stale_pages(group, history)


def batch_pages(group: LayerGroup, batch: Iterable[tuple[int, int]]) -> int:
    """Pages a whole batch of (capacity, history) shapes needs in `group`."""
    return sum(pages_needed(group, c, h) for c, h in batch)


def pages_per_group(spec: ModelSpec, batch: Iterable[tuple[int, int]]) -> dict[str, int]:
    """Pages per group name for a batch of (capacity, history) shapes."""
    shapes = list(batch)
    return {g.name: batch_pages(g, shapes) for g in spec.groups}


def decode_worst_case_pages(group: LayerGroup, headroom: int = 1) -> int | None:
    """Most live pages one decoding request can hold in `group` at any length,
    when capacity leads history by at most `headroom` (= 1 + draft + extra);
    None when it grows without bound (full and compressed groups). Exact, not
    a bound: see each kind's rule in `spec.kinds`."""
    return group.rule.decode_worst_case_pages(group, headroom)
