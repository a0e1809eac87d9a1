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

The memo also keeps the pages the previous prompt's hit attached in each
group whose pages never go stale. A pool's map sends a hash to one page until
the pair is dropped (`PagePool.drops` counts drops; `store` never remaps a
hash), so while no pool's count moved those pages still hold those digests,
and the shared part of the next hit needs no lookup at all.
"""

from __future__ import annotations

from array import array

import numpy as np

from kvpool.cache.hashing import extend_hashes
from kvpool.cache.pool import PagePool

__all__ = ["PromptMemo"]


class PromptMemo:
    """Digests of the last prompt given to `digests`, and the pages its hit
    found (`remember_hit`): one prompt, a bounded memory cost."""

    def __init__(self) -> None:
        self.seed = 0
        self.ids = np.empty(0, np.int64)
        self.hashes: list[int] = []
        self.pages: dict[int, list[int]] = {}  # group index -> the pages the last hit attached
        self.drops: dict[int, int] = {}  # group index -> its pool's `drops` when they were remembered

    def digests(
        self, ids: array[int], tokens_per_block: int, seed: int, num_blocks: int, pools: list[PagePool]
    ) -> tuple[list[int], dict[int, list[int]]]:
        """The chained digests of the first `num_blocks` whole pages of `ids`
        (checked int64 token ids) under `seed` (a list of the caller's own),
        and by group the pages known to hold the leading ones: the remembered
        hit's, for the part shared with the remembered prompt, in each group
        whose pool has dropped no hash since. Remembers the digests (and
        forgets the hit: `remember_hit` gives the new one)."""
        out: list[int] = []
        known: dict[int, list[int]] = {}
        if seed == self.seed and self.hashes:
            same = self.common_pages(ids, tokens_per_block, num_blocks)
            out = self.hashes[:same]
            known = {gi: pages[:same] for gi, pages in self.pages.items() if pools[gi].drops == self.drops[gi]}
        extend_hashes(out, ids, tokens_per_block, seed, num_blocks)
        if num_blocks:
            n = num_blocks * tokens_per_block
            self.seed, self.ids, self.hashes = seed, np.frombuffer(ids[:n].tobytes(), np.int64), out[:]
        self.pages = {}
        return out, known

    def remember_hit(self, pages: dict[int, list[int]], pools: list[PagePool]) -> None:
        """The pages that the hit of the prompt last given to `digests`
        attached, by group (block i holds digest i; never-stale groups only)."""
        self.pages, self.drops = pages, {gi: pools[gi].drops for gi in pages}

    def common_pages(self, ids: array[int], tokens_per_block: int, num_blocks: int) -> int:
        """Leading whole pages (at most `num_blocks`) whose token ids equal the
        remembered prompt's."""
        n = min(num_blocks, len(self.hashes), len(self.ids) // tokens_per_block) * tokens_per_block
        if n == 0:
            return 0
        new = np.frombuffer(ids, np.int64, count=n)  # a view: gone (and `ids` resizable again) on return
        differ = np.flatnonzero(new != self.ids[:n])
        return (int(differ[0]) if differ.size else n) // tokens_per_block
