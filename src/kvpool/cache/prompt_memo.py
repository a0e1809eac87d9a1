"""The last prompt's page digests, for the next prompt that starts like it.

Requests that share a system prompt arrive one after another; each would
digest the same leading pages again (one XXH3 call per page, ~0.15 µs each
from Python: 40 µs for a 4,096-token prefix). A page's digest is a pure
function of the salt's seed and the tokens up to the page's end
(`cache/hashing.py`), so the digests of the whole pages a prompt shares with
the previous one (same seed, same token ids, compared in one NumPy pass) are
taken as they are, and only the rest is digested: the result is exactly
`extend_hashes` from scratch. The digest objects are shared as well, which
keeps the pools' hash-map hits cheap (a key found by identity is not compared).

Prompts come back too: a preempted request is admitted again, a waiting
one is asked about more than once. The digests of the last `RECENT` prompts
are kept by one XXH3 (or BLAKE2b) digest of the prompt's bytes and its seed,
so each prompt's pages are digested once while it is recent.

The memo also keeps the pages the previous prompt's hit attached in each
group whose pages never go stale. A pool's map sends a hash to one page until
the pair is dropped (`PagePool.drops` counts drops; `store` never remaps a
hash), so while no pool's count moved those pages still hold those digests,
and the shared part of the next hit needs no lookup at all. The ids just
digested, given again (a scheduler's `create` of the head `can_create`
answered, or the head asked again), are answered as they were: no compare.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from kvpool.cache.hashing import MASK64, Chain, extend_hashes, page_digest
from kvpool.cache.pool import PagePool

__all__ = ["KnownPages", "PromptMemo"]


class KnownPages(NamedTuple):
    """Leading pages of a group known to hold a prompt's leading digests, twice:
    as ints for the pool's reference counts and as a table row, so a hit
    writes them into its table with one array copy (a list converts per item)."""

    pages: list[int]
    row: npt.NDArray[np.int32]


GALLOP = 32  # pages `common_pages` compares first (past page 0), then 4 times as many each time
RECENT = 256  # prompts whose digests are kept whole (about 3 KiB each for a 12k-token prompt)


class PromptMemo:
    """Digests of the last prompt given to `digests`, and the pages its hit
    found (`remember_hit`); the digests of the `RECENT` last prompts: a
    bounded memory cost."""

    def __init__(self) -> None:
        self.seed = 0
        self.ids = array("q")
        self.hashes: list[int] = []
        self.pages: dict[int, KnownPages] = {}  # group index -> the pages the last hit attached
        self.drops: dict[int, int] = {}  # group index -> its pool's `drops` when they were remembered
        self.recent: OrderedDict[tuple[int, int, int], list[int]] = OrderedDict()  # (seed, pages, bytes' digest)

    def digests(
        self,
        ids: array[int],
        tokens_per_block: int,
        seed: int,
        num_blocks: int,
        pools: list[PagePool],
        chain: Chain | None = None,
    ) -> tuple[list[int], dict[int, KnownPages]]:
        """The chained digests of the first `num_blocks` whole pages of `ids`
        (checked int64 token ids) under `seed` (a list of the caller's own),
        and by group the pages known to hold the leading ones: the remembered
        hit's, for the part shared with the remembered prompt, in each group
        whose pool has dropped no hash since. Remembers the digests and `ids`
        itself (so change no id of it afterwards; appending is fine), and
        forgets the hit (`remember_hit` gives the new one)."""
        out: list[int] = []
        known: dict[int, KnownPages] = {}
        kept: list[int] | None = None  # a list the memo holds already with exactly `out` (it only reads them)
        ahead: int = getattr(chain, "ahead", 0)  # lookahead digests read ids past their pages
        if seed == self.seed and self.hashes and not ahead:
            same = self.common_pages(ids, tokens_per_block, num_blocks)
            kept = self.hashes if same == len(self.hashes) else None  # (the prompt just digested: `create`)
            out = self.hashes[:same]
            known = {  # a hit's pages past `same` cut off, a whole one as it is
                gi: held if len(held.pages) <= same else KnownPages(held.pages[:same], held.row[:same])
                for gi, held in self.pages.items()
                if pools[gi].drops == self.drops[gi]
            }
        if len(out) < num_blocks:
            out, kept = self.digest_rest(out, ids, tokens_per_block, seed, num_blocks, chain)
        if num_blocks:
            self.seed, self.ids, self.hashes = seed, ids, out[:] if kept is None else kept
        self.pages = {}
        return out, known

    def digest_rest(
        self, out: list[int], ids: array[int], tokens_per_block: int, seed: int, num_blocks: int, chain: Chain | None
    ) -> tuple[list[int], list[int] | None]:
        """`out` (the leading digests known) extended to `num_blocks` pages of
        `ids`, and a list the memo keeps with the same digests (None: none):
        a recent prompt's are taken whole, by a digest of its bytes; a new
        one's become recent."""
        if getattr(chain, "ahead", 0):  # lookahead digests read ids past their pages: not kept by bytes
            extend_hashes(out, ids, tokens_per_block, seed, num_blocks, chain)
            return out, None
        with memoryview(ids) as view:  # the prompt's bytes digested in place, not copied twice
            key = (seed, num_blocks, page_digest(view[: num_blocks * tokens_per_block], seed & MASK64))
        whole = self.recent.get(key)
        if whole is None:
            extend_hashes(out, ids, tokens_per_block, seed, num_blocks, chain)
            whole = self.recent[key] = out[:]
            if len(self.recent) > RECENT:
                self.recent.popitem(last=False)
            return out, whole
        self.recent.move_to_end(key)
        return whole[:], whole

    def same_ids(self, tokens: object) -> array[int] | None:
        """The remembered prompt's checked ids when `tokens` is an int64 array
        that holds exactly them (a scheduler asking about the head of its queue
        again, then creating it), else None: equal ids need no second copy
        and check, and `digests` of them compares no page."""
        ids = self.ids
        if type(tokens) is not array or tokens.typecode != "q" or len(tokens) != len(ids) or not ids:
            return None
        # NumPy compares the buffers a vector at a time (an array's own == compares item by item)
        same = tokens is ids or bool((np.frombuffer(tokens, np.int64) == np.frombuffer(ids, np.int64)).all())
        return ids if same else None

    def remember_hit(self, pages: dict[int, KnownPages], pools: list[PagePool]) -> None:
        """The pages that the hit of the prompt last given to `digests`
        attached, by group (block i holds digest i; never-stale groups only)."""
        self.pages, self.drops = pages, {gi: pools[gi].drops for gi in pages}

    def common_pages(self, ids: array[int], tokens_per_block: int, num_blocks: int) -> int:
        """Leading whole pages (at most `num_blocks`) whose token ids equal the
        remembered prompt's."""
        n = min(num_blocks, len(self.hashes), len(self.ids) // tokens_per_block) * tokens_per_block
        if ids is self.ids:  # the remembered prompt itself (`same_ids`, or `create` after `can_create`)
            return n // tokens_per_block
        if n == 0 or ids[:tokens_per_block] != self.ids[:tokens_per_block]:  # unrelated prompts: no NumPy
            return 0
        new = np.frombuffer(ids, np.int64, count=n)  # views: gone (and `ids` resizable again) on return
        old = np.frombuffer(self.ids, np.int64, count=n)
        # compared a stretch at a time, each 4 times the one before: prompts that share a system prompt
        # differ just past it, and a whole long prompt's compare (and its mask) costs more than a few stretches
        start, width = tokens_per_block, GALLOP * tokens_per_block  # (page 0 is equal)
        while start < n:
            end = min(n, start + width)
            differ = new[start:end] != old[start:end]
            first = int(differ.argmax())  # stops at the first difference (`flatnonzero` walks them all)
            if differ[first]:
                return (start + first) // tokens_per_block
            start, width = end, 4 * width
        return n // tokens_per_block
