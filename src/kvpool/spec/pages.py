"""The one page arithmetic (DESIGN rule 1).

Sizing, the capacity query, dummy allocation and run-time resizes all ask these
functions how many pages a request needs; nothing else in kvpool divides by
`tokens_per_block`. A request is described by `capacity` (positions that have
slots) and `history` (positions already computed, immutable); `capacity >=
history`. The token at position `history` is the one in flight.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import gcd
from typing import NamedTuple

from kvpool.spec.groups import LayerGroup, ModelSpec


class Shape(NamedTuple):
    """One request of a batch, as the page arithmetic sees it."""

    capacity: int
    history: int = 0


def stale_pages(group: LayerGroup, history: int) -> int:
    """Leading pages no longer needed once `history` positions are computed.

    sliding(W): the in-flight token at position `history` still attends to
    positions `history + 1 - W` onwards, so pages `[0, floor((history+1-W)/tpb))`
    are stale. chunked(C): pages wholly before the in-flight token's chunk.
    full, compressed and state groups never go stale page by page.
    """
    tpb = group.tokens_per_block
    if group.kind == "sliding":
        assert group.window is not None
        return max(0, (history + 1 - group.window) // tpb)
    if group.kind == "chunked":
        assert group.window is not None
        return (history // group.window) * group.window // tpb
    return 0


def pages_needed(group: LayerGroup, capacity: int, history: int = 0) -> int:
    """Live pages (slots) of one request in `group`: `ceil(capacity/tpb) - stale`.

    A `state` group needs one slot per request that has any capacity.
    """
    if capacity <= 0:
        return 0
    if group.kind == "state":
        return 1
    return -(-capacity // group.tokens_per_block) - stale_pages(group, history)


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
    None when it grows without bound (full and compressed groups).

    sliding(W): with x = W + headroom - 1 live positions and the window start at
    any offset r inside a page, live pages are ceil((r + x)/tpb), largest at
    r = tpb - 1. That equals the textbook bound ceil(x/tpb) + 1 except when
    x mod tpb == 1, where the bound over-counts by one page. chunked(C): the
    chunk start falls on offsets that are multiples of gcd(C, tpb).
    """
    tpb = group.tokens_per_block
    if group.kind == "state":
        return 1
    if group.kind == "sliding":
        assert group.window is not None
        x = group.window + headroom - 1
        return (x + 2 * tpb - 2) // tpb
    if group.kind == "chunked":
        assert group.window is not None
        x = group.window + headroom - 1
        worst_offset = tpb - gcd(group.window, tpb)
        return -(-(worst_offset + x) // tpb)
    return None
