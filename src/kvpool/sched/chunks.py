"""The longest prefill chunk the free pages hold: the scheduler sizes each
chunk of a prompt (a new admission's first, or a running prefill's next) by
resizing the request for it, and where the whole chunk does not fit, for
the longest shorter one that does. Packing chunks this way fills the pools
the way engines that admit until the pages run out do (docs/sched.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvpool.plan.feasibility import largest_fitting
from kvpool.sched.paged_cache import PagedCache


class ChunkSizer:
    """Sizes prefill chunks against `manager`'s free pages, for requests
    whose capacity runs `extra` positions (`num_extra_kv_tokens`) past
    their chunk. `largest` resizes the request (side effect); the others
    only count or probe."""

    def __init__(self, manager: PagedCache, extra: int) -> None:
        self.manager, self.extra = manager, extra
        # groups whose pages grow with capacity, per pool: a chunk one page shorter spares one page of each
        self.growing: dict[str, int] = {}
        for g in manager.spec.groups:
            if not g.rule.per_request:
                pool = manager.pool_of(g.name)
                self.growing[pool] = self.growing.get(pool, 0) + 1

    def largest(self, rid: int, history: int, tokens: int) -> int:
        """Resize `rid` for the longest prefill chunk of at most `tokens` tokens
        after `history` that the free pages hold, and return its length (0: not
        even one token; nothing changed)."""
        extra = self.extra
        whole = self.manager.resize(rid, history + tokens + extra, history)
        if whole:
            return tokens
        if self.manager.capacity(rid) <= history + 1 + extra:  # early return: the answer counted from `short`
            n = self.by_pages(whole.short, history + extra, tokens)
            if n == 0 or self.manager.resize(rid, history + n + extra, history):
                return n
        return self.probed(rid, history, tokens, whole.short)  # (a resumed request past its chunk's start)

    def by_pages(self, short: Mapping[str, int], start: int, tokens: int) -> int:
        """The longest chunk below `tokens` whose pages fit, where the whole
        `tokens` left each pool `short[pool]` pages short, for a request whose
        capacity then grows from at most `start + 1` (so that no chunk of one
        position or more releases a page, and the pages each takes from the
        stale ones at its history on are the same): a chunk
        ending at capacity c takes ceil(c / tpb) blocks in each of a pool's
        growing groups (`spec.pages.table_blocks`; a state group takes its one
        slot whatever c is), so a pool g growing groups short of s pages holds
        a chunk whose blocks are ceil(s / g) fewer per group. Exactly what
        asking `resize` chunk by chunk finds (tests/test_sched_chunks.py)."""
        tpb = self.manager.spec.tokens_per_block
        blocks = -(-(start + tokens) // tpb)  # per growing group, for the whole chunk
        n = tokens - 1
        for pool, missing in short.items():
            growing = self.growing.get(pool, 0)
            if not growing:  # only state slots lack pages: no chunk makes up for them
                return 0
            n = min(n, (blocks - -(-missing // growing)) * tpb - start)
        return max(n, 0)

    def probed(self, rid: int, history: int, tokens: int, short: Mapping[str, int]) -> int:
        """`largest` by asking `resize` (whose refusal for the whole
        chunk said `short`), bisecting on its answers: for a request whose
        capacity may already be past the chunk's first position."""
        extra = self.extra

        # pages needed grow with the chunk: bisect on the manager's own answer, from below by the chunk
        # shorter by the most pages a pool lacked (each group's live pages at a fixed history grow by one
        # per tpb positions, so that one usually fits; where not, a state slot, from 1)
        def fits(m: int) -> bool:
            return bool(self.manager.resize(rid, history + m + extra, history))

        tpb = self.manager.spec.tokens_per_block
        lo = tokens - max(short.values()) * tpb
        if lo > 0 and fits(lo):
            # the chunk that ends where lo's last page does takes no page more in a group of whole pages: try
            # it and the position after it first, which settles the usual case (one pool of such groups)
            end = min(tokens - 1, lo + (-(history + lo + extra)) % tpb)
            if end > lo and not fits(end):
                n = largest_fitting(lo + 1, end - 1, fits)
            elif end == tokens - 1 or not fits(end + 1):
                n = end
            else:
                n = largest_fitting(end + 1, tokens - 1, fits)
        else:
            n = largest_fitting(1, (lo if lo > 0 else tokens) - 1, fits)
        if n > 0 and not self.manager.resize(rid, history + n + extra, history):  # pragma: no cover
            return 0
        return max(n, 0)
