"""One rule object per attention kind: everything that kind means, in one place.

A pool group's *kind* is its life cycle (docs/design.md, vocabulary): when the
KV of a position stops being needed, and so which pages a request keeps, what
a query sees, what a decode holds at worst and what a step reads. Every layer
that needs one of those answers asks the group's rule (`rule_of(group)`)
instead of branching on kind names: the page arithmetic (`spec/pages.py`), the
cache's reuse and capacity query, the engine's attention masks and the
simulator's step times. Adding a kind is one `KindRule` subclass, registered
with `register_kind`, plus its tests.

Rules are stateless; they read a group's `tokens_per_block`, `window` (W or C)
and `ratio` through the `Life` protocol, so this module imports nothing else
of kvpool's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from kvpool.errors import SpecError

NEVER = 1 << 62  # a history no request reaches: "never goes stale"


class Life(Protocol):
    """What a rule reads of a group (a `LayerGroup` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def tokens_per_block(self) -> int: ...
    @property
    def window(self) -> int | None: ...
    @property
    def ratio(self) -> int | None: ...


class KindRule:
    """The questions every kind answers. The defaults are full attention's:
    every position is kept for the whole sequence, one row per position.

    `per_request`: the group keeps one fixed-size slot per request (recurrent
    state) instead of pages of positions. `dense_rows`: one K/V row per
    position, read through a mask (what the reference engine's paged attention
    can store).
    """

    name: ClassVar[str] = "full"
    per_request: ClassVar[bool] = False
    dense_rows: ClassVar[bool] = True

    def validate(self, g: Life) -> None:
        """Raise SpecError when the group's parameters do not fit this kind."""

    def stale_pages(self, g: Life, history: int) -> int:
        """Leading pages no longer needed once `history` positions are computed
        (the in-flight token is at position `history`)."""
        return 0

    def rows_per_page(self, g: Life) -> int:
        """Stored rows in one page."""
        return g.tokens_per_block

    def rows_per_position(self, g: Life) -> int:
        """Positions one stored row covers (a step of n tokens writes n / this rows)."""
        return 1

    def first_visible(self, g: Life, position: Any) -> Any:
        """First key position a query at `position` attends to (works on ints
        and on NumPy / torch arrays; not clamped at 0)."""
        return position * 0

    def decode_worst_case_pages(self, g: Life, headroom: int) -> int | None:
        """Most live pages one decoding request holds at any length, when
        capacity leads history by at most `headroom`; None when unbounded."""
        return None

    def need_period(self, g: Life) -> tuple[int, int, int]:
        """For a kind whose need is bounded: (period, periodic_from,
        monotone_to) — the pages a decode of token_num t needs repeat with
        `period` for t >= `periodic_from` and only grow up to `monotone_to`
        (the capacity query uses it to scan instead of bisect)."""
        return 1, 1, NEVER

    def keys_read(self, g: Life, history: Any) -> Any:
        """Key rows a query at position `history` reads (ints or arrays)."""
        return history + 1

    def exact_keys_sum(self, histories: Sequence[int], steps: int = 1) -> int | None:
        """The int sum of `keys_read` over queries at `histories` when this
        class's h + 1 (full attention) is the rule and floats add it exactly,
        else None. `steps` > 1 asks about the last of that many steps, each
        one position further: the sum then grows by len(histories) a step.
        Floats hold every partial sum exactly while the histories are ints
        >= 0 and the total is at most 2**53: then any order of float additions
        gives this sum (`keys_read_sum`, the step-time model's decode runs)."""
        if type(self).keys_read is not KindRule.keys_read or not histories:
            return None
        total = sum(histories) + len(histories)
        last = total + len(histories) * (steps - 1)
        return total if type(total) is int and last <= 1 << 53 and min(histories) >= 0 else None

    def keys_read_sum(self, g: Life, histories: list[int]) -> float:
        """`keys_read` summed over queries at `histories`, added one by one to
        0.0 (the key rows a step's decode rows read): summed in C where
        `exact_keys_sum` says the float is the same."""
        total = self.exact_keys_sum(histories)
        if total is not None:
            return float(total)
        out = 0.0
        for h in histories:
            out += self.keys_read(g, h)
        return out

    def prefill_pairs(self, g: Life, start: int, n: int) -> float:
        """(query, key-row) pairs of a causal prefill chunk of `n` tokens after `start`."""
        a, b = start + 1, start + n
        return n * (a + b) / 2.0

    def key_span(self, g: Life, queries: int) -> int | None:
        """Most key positions `queries` consecutive queries of one row see
        together; None when it grows with the sequence."""
        return None

    def describe(self, g: Life) -> str:
        """The life cycle in a few words (for `kvpool inspect`)."""
        return "whole sequence"


class Full(KindRule):
    """`full`: every position is kept for the whole sequence."""


class Sliding(KindRule):
    """`sliding(W)`: a query at q sees keys q - W < k <= q (as transformers
    does), so pages `[0, floor((history + 1 - W)/tpb))` are stale."""

    name = "sliding"

    def validate(self, g: Life) -> None:
        if not (g.window and g.window > 0):
            raise SpecError(f"group {g.name}: a {self.name} group needs a positive window")

    def stale_pages(self, g: Life, history: int) -> int:
        assert g.window is not None
        return max(0, (history + 1 - g.window) // g.tokens_per_block)

    def first_visible(self, g: Life, position: Any) -> Any:
        assert g.window is not None
        return position + 1 - g.window

    def decode_worst_case_pages(self, g: Life, headroom: int) -> int | None:
        # x = W + headroom - 1 live positions starting at offset r inside a
        # page: ceil((r + x)/tpb) live pages, largest at r = tpb - 1 (the
        # textbook bound ceil(x/tpb) + 1 over-counts by one when x mod tpb == 1)
        assert g.window is not None
        tpb = g.tokens_per_block
        return (g.window + headroom - 1 + 2 * tpb - 2) // tpb

    def need_period(self, g: Life) -> tuple[int, int, int]:
        assert g.window is not None
        return g.tokens_per_block, g.window, g.window + g.tokens_per_block - 1

    def keys_read(self, g: Life, history: Any) -> Any:
        assert g.window is not None
        return _minimum(history + 1, g.window)

    def prefill_pairs(self, g: Life, start: int, n: int) -> float:
        assert g.window is not None
        a, b, w = start + 1, start + n, g.window
        if b <= w:
            return n * (a + b) / 2.0
        if a >= w:
            return float(n * w)
        return (w - a + 1) * (a + w) / 2.0 + (b - w) * w

    def key_span(self, g: Life, queries: int) -> int | None:
        assert g.window is not None
        return g.window + queries - 1

    def describe(self, g: Life) -> str:
        return f"window {g.window}"


class Chunked(Sliding):
    """`chunked(C)`: a query sees the keys of its own chunk of C positions, so
    pages wholly before the in-flight token's chunk are stale."""

    name = "chunked"

    def stale_pages(self, g: Life, history: int) -> int:
        assert g.window is not None
        return (history // g.window) * g.window // g.tokens_per_block

    def first_visible(self, g: Life, position: Any) -> Any:
        assert g.window is not None
        return position // g.window * g.window

    def decode_worst_case_pages(self, g: Life, headroom: int) -> int | None:
        # the chunk start falls on page offsets that are multiples of gcd(C, tpb)
        assert g.window is not None
        tpb = g.tokens_per_block
        worst_offset = tpb - math.gcd(g.window, tpb)
        return -(-(worst_offset + g.window + headroom - 1) // tpb)

    def need_period(self, g: Life) -> tuple[int, int, int]:
        assert g.window is not None
        return math.lcm(g.window, g.tokens_per_block), 1, g.window

    def keys_read(self, g: Life, history: Any) -> Any:
        assert g.window is not None
        return history % g.window + 1

    def prefill_pairs(self, g: Life, start: int, n: int) -> float:
        assert g.window is not None
        if n > 4096:
            return n * g.window / 2.0
        return float(sum(self.keys_read(g, start + j) for j in range(n)))

    def describe(self, g: Life) -> str:
        return f"chunk {g.window}"


class Compressed(KindRule):
    """`compressed(r)`: one stored row per r positions, kept for the whole
    sequence; a page covers tpb positions and so holds tpb / r rows."""

    name = "compressed"
    dense_rows = False

    def validate(self, g: Life) -> None:
        if not (g.ratio and g.ratio > 0):
            raise SpecError(f"group {g.name}: a compressed group needs a positive ratio")
        if g.tokens_per_block % g.ratio:
            raise SpecError(
                f"tokens_per_block {g.tokens_per_block} is not a multiple of compress ratio "
                f"{g.ratio} (group {g.name}); use a multiple of {g.ratio}"
            )

    def rows_per_page(self, g: Life) -> int:
        assert g.ratio is not None
        return g.tokens_per_block // g.ratio

    def rows_per_position(self, g: Life) -> int:
        assert g.ratio is not None
        return g.ratio

    def keys_read(self, g: Life, history: Any) -> Any:
        assert g.ratio is not None
        return (history + 1) / g.ratio

    def prefill_pairs(self, g: Life, start: int, n: int) -> float:
        assert g.ratio is not None
        return super().prefill_pairs(g, start, n) / g.ratio

    def describe(self, g: Life) -> str:
        return f"1 row / {g.ratio} tokens"


class State(KindRule):
    """`state`: a fixed-size recurrent state, one slot per request; no pages of
    positions, nothing to attend to."""

    name = "state"
    per_request = True
    dense_rows = False

    def rows_per_page(self, g: Life) -> int:
        return 0

    def decode_worst_case_pages(self, g: Life, headroom: int) -> int | None:
        return 1

    def keys_read(self, g: Life, history: Any) -> Any:
        return history * 0

    def prefill_pairs(self, g: Life, start: int, n: int) -> float:
        return 0.0

    def key_span(self, g: Life, queries: int) -> int | None:
        return 0

    def describe(self, g: Life) -> str:
        return "per request"


RULES: dict[str, KindRule] = {r.name: r for r in (Full(), Sliding(), Chunked(), Compressed(), State())}


def register_kind(rule: KindRule) -> None:
    """Make `rule.name` a kind that groups, plans, the cache and the simulator
    accept. Raises SpecError when the name is taken by another rule."""
    if RULES.get(rule.name, rule) is not rule:
        raise SpecError(f"attention kind {rule.name!r} is already registered")
    RULES[rule.name] = rule


def kind_rule(kind: str) -> KindRule:
    """The rule of `kind`; SpecError naming the known kinds for any other."""
    try:
        return RULES[kind]
    except KeyError:
        raise SpecError(f"unknown attention kind {kind!r}; known: {', '.join(RULES)}") from None


def _minimum(a: Any, b: int) -> Any:
    """min() for numbers, elementwise for arrays (NumPy or torch)."""
    return min(a, b) if isinstance(a, int | float) else a.clip(max=b)
