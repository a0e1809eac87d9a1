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

Prompts come back too, whole or in part: a preempted request is admitted
again, a conversation's next turn starts with the whole of its last one, an
agent's calls share its tool descriptions. So the memo also indexes the
recent prompts' runs of `RUN` pages by the run's parent digest and first
token id, with a fingerprint of its ids (one XXH3, or BLAKE2b, digest of the
run's bytes under the parent digest): a run whose fingerprint matches is
taken whole, and past the last one taken the prompt's own pages are
digested. A page's digest is a function of its parent's and its ids alone, so
those taken are those computed (up to a 64-bit collision, as the digests
themselves); the index holds no ids, only digests.

The memo also keeps the pages the previous prompt's hit attached in each
group whose pages never go stale. A pool's map sends a hash to one page until
the pair is dropped (`PagePool.drops` counts drops; `store` never remaps a
hash), so while no pool's count moved those pages still hold those digests,
and the shared part of the next hit needs no lookup at all.
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


RUN = 16  # pages a run: the prompt's first page and each 16th one are indexed (a 12k-token prompt: 24 runs)
RUNS = 16384  # indexed runs, the oldest dropped: about 300 bytes each (no ids: a fingerprint and 16 digests)


class PromptMemo:
    """Digests of the last prompt given to `digests`, and the pages its hit
    found (`remember_hit`); the runs of the recent prompts (at most `RUNS`):
    a bounded memory cost."""

    def __init__(self) -> None:
        self.seed = 0
        self.ids = array("q")
        self.hashes: list[int] = []
        self.pages: dict[int, KnownPages] = {}  # group index -> the pages the last hit attached
        self.drops: dict[int, int] = {}  # group index -> its pool's `drops` when they were remembered
        # (parent digest or seed, first id) of a run -> (its ids' digest under the parent, its pages' digests)
        self.runs: OrderedDict[tuple[int, int], tuple[int, list[int]]] = OrderedDict()

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
        ahead: int = getattr(chain, "ahead", 0)  # lookahead digests read ids past their pages
        if seed == self.seed and self.hashes and not ahead:
            same = self.common_pages(ids, tokens_per_block, num_blocks)
            out = self.hashes[:same]
            known = {
                gi: KnownPages(held.pages[:same], held.row[:same])
                for gi, held in self.pages.items()
                if pools[gi].drops == self.drops[gi]
            }
        if len(out) < num_blocks and ahead:
            extend_hashes(out, ids, tokens_per_block, seed, num_blocks, chain)
        elif len(out) < num_blocks:
            self.extend(out, ids, tokens_per_block, seed, num_blocks, chain)
        if num_blocks:
            self.seed, self.ids, self.hashes = seed, ids, out[:]
        self.pages = {}
        return out, known

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

    def extend(
        self, out: list[int], ids: array[int], tokens_per_block: int, seed: int, num_blocks: int, chain: Chain | None
    ) -> None:
        """`extend_hashes(out, ids, ...)`, taking each run of pages that the
        index holds under the same parent digest, first id and fingerprint;
        then indexes the runs this prompt digested."""
        tpb, runs = tokens_per_block, self.runs
        digested: list[int] = []  # first pages of the runs digested here
        with memoryview(ids) as view:  # runs fingerprinted in place
            while len(out) < num_blocks:
                page = len(out)
                if page % RUN:  # up to the next run, where the index may hold more
                    extend_hashes(out, ids, tpb, seed, min(num_blocks, page - page % RUN + RUN), chain)
                    continue
                key = (out[-1] if page else seed, ids[page * tpb])
                held, stop = runs.get(key), min(num_blocks, page + RUN)
                if held is None:  # no run indexed here: none later holds this prefix either
                    stop = num_blocks
                elif len(held[1]) == stop - page and held[0] == page_digest(
                    view[page * tpb : stop * tpb], key[0] & MASK64
                ):
                    out += held[1]
                    runs.move_to_end(key)
                    continue
                digested += range(page, stop, RUN)
                extend_hashes(out, ids, tpb, seed, stop, chain)
            for page in digested:
                parent, stop = out[page - 1] if page else seed, min(num_blocks, page + RUN)
                fingerprint = page_digest(view[page * tpb : stop * tpb], parent & MASK64)
                runs[parent, ids[page * tpb]] = (fingerprint, out[page:stop])
                if len(runs) > RUNS:
                    runs.popitem(last=False)

    def common_pages(self, ids: array[int], tokens_per_block: int, num_blocks: int) -> int:
        """Leading whole pages (at most `num_blocks`) whose token ids equal the
        remembered prompt's."""
        if ids is self.ids:  # the remembered prompt itself (`same_ids`)
            return min(num_blocks, len(self.hashes), len(self.ids) // tokens_per_block)
        return first_differing_page(ids, self.ids, tokens_per_block, 0, min(num_blocks, len(self.hashes)))


def first_differing_page(ids: array[int], other: array[int], tokens_per_block: int, first: int, last: int) -> int:
    """The first page from page `first` up to `last` (at most) whose token
    ids differ between `ids` and `other`, or where either ends."""
    start, n = first * tokens_per_block, min(last, len(ids) // tokens_per_block, len(other) // tokens_per_block)
    n = n * tokens_per_block - start
    if n <= 0 or ids[start : start + tokens_per_block] != other[start : start + tokens_per_block]:
        return first  # unrelated prompts: no NumPy
    new = np.frombuffer(ids, np.int64, count=n, offset=8 * start)  # a view: gone (and `ids` resizable again) on return
    differ = new != np.frombuffer(other, np.int64, count=n, offset=8 * start)
    at = int(differ.argmax())  # stops at the first difference (`flatnonzero` walks them all)
    return first + (at if differ[at] else n) // tokens_per_block
