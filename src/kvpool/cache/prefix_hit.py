"""What a new request can reuse of the prefix cache, and whether it fits:
the longest hit of a prompt's page digests (`longest_hit`), per tier
(`cached_prefix`), and `KVCacheManager.can_create`'s answer (`create_check`).
Changes no page; `cache/prefix.py` claims and attaches the pages of a hit.

Per-group rules for a hit of k whole pages (n = k * tpb reused positions; the
request then has capacity = history = n):

- a group of pages needs the pages that are live at history n, i.e. pages
  `stale_pages(group, n)`..k-1: every page 0..k-1 for full and compressed
  groups (compressed pages still cover tpb positions, so only whole pages are
  ever reused), the last window of the hit for sliding and chunked ones;
- a per-request (state) group needs a snapshot taken when a request's history was exactly n
  (only with `state_snapshots=True`; without, a model with a state group
  never reuses); the snapshot page becomes the new request's state slot (its
  hash is dropped, since the request will overwrite it).

The longest k that satisfies every group wins. Page digests are chained
(`cache/hashing.py`); the last prompt's are remembered (`cache/prompt_memo.py`).
The functions take the page tables, never the manager.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from functools import partial
from itertools import compress, count, islice, takewhile
from operator import eq, is_not, itemgetter, not_, truth
from typing import NamedTuple, cast

import numpy as np
import numpy.typing as npt

from kvpool.cache.cold import ColdStore
from kvpool.cache.pool import PagePool
from kvpool.cache.prompt_memo import KnownPages, PromptMemo
from kvpool.cache.results import CreateCheck
from kvpool.cache.tables import PageTables
from kvpool.media import COLD, Medium
from kvpool.spec.pages import stale_pages, table_blocks


def longest_hit(
    t: PageTables,
    hashes: Sequence[int],
    known: dict[int, KnownPages] | None = None,
    tier: ColdStore | None = None,
    *,
    media: frozenset[Medium] | None = None,
    fits: bool = True,
    runs: dict[int, list[int]] | None = None,
) -> int:
    """Largest k <= len(hashes) such that a request can reuse k whole pages.
    `known[gi]`: leading pages of a never-stale group known to hold these
    digests (from `PromptMemo.digests`), not looked up again. With a cold
    `tier`, a digest it (or a tier below) holds counts too (only the tiers of
    `media`, when given), as long as the GPU pools have the pages to copy such
    digests into (`onboard_fits`; not asked with `fits=False`). Without a
    tier, `runs[gi]` gets the pages of each never-stale group's leading cached
    run after its known pages (as found: the caller need not look them up again)."""
    k = len(hashes)
    pools = t.pools
    for gi in range(len(pools)):
        if t.never_stale[gi] and not t.is_state[gi]:  # the leading cached run, counted in C
            skip = len(known[gi].pages) if known and gi in known else 0
            if runs is not None and tier is None:
                rest = islice(hashes, skip, None) if skip else hashes  # (an islice costs a tenth of the walk)
                got: list[int | None] = list(takewhile(_is_page, map(pools[gi].cached.get, rest)))
                run = runs[gi] = cast("list[int]", got)
                k = min(k, skip + len(run))
            else:
                k = min(k, skip + len(list(takewhile(holds(t, gi, tier, media), islice(hashes, skip, None)))))
    tpb = t.tokens_per_block
    checks = [gi for gi in range(len(pools)) if t.is_state[gi] or not t.never_stale[gi]]
    while k > 0:
        for gi in checks:
            held = holds(t, gi, tier, media)
            wanted = hashes[k - 1 : k] if t.is_state[gi] else hashes[stale_pages(t.groups[gi], k * tpb) : k]
            if not all(map(held, wanted)):
                break
        else:
            if tier is None or not fits or onboard_fits(t, hashes, k):
                return k
        k -= 1
    return 0


_is_page = partial(is_not, None)  # a pool's `cached.get` found a page


def holds(
    t: PageTables, gi: int, tier: ColdStore | None, media: frozenset[Medium] | None = None
) -> Callable[[int], bool]:
    """Whether a digest is cached for group `gi`: in its GPU pool, or in a cold
    tier that keeps the group (of `media`, when given)."""
    cached = t.pools[gi].cached
    if tier is None or not tier.keeps(gi):
        return cached.__contains__
    cold = tier.holder(gi, media)
    return lambda h: h in cached or cold(h)


class TierHit(NamedTuple):
    """Tokens reusable from the GPU alone (`gpu`), with the host tier as well
    (`cpu`), and with every tier (`disk`; each at least the one before): what
    Dynamo's KV indexer reports per tier, and `kvpool.index` too."""

    gpu: int
    cpu: int
    disk: int

    @property
    def longest(self) -> int:
        return self.disk


def cached_prefix(t: PageTables, hashes: Sequence[int], tier: ColdStore | None) -> TierHit:
    """`TierHit` of the pages of `hashes`: the longest hit each set of tiers
    holds, under every group's rule, GPU room for onboarding aside."""
    tpb = t.tokens_per_block
    hits = [tpb * longest_hit(t, hashes, None, tier, media=media, fits=False) for media in TIER_MEDIA]
    return TierHit(*hits)


TIER_MEDIA: tuple[frozenset[Medium], ...] = (frozenset(), frozenset(COLD[:1]), frozenset(COLD))


def onboard_fits(t: PageTables, hashes: Sequence[int], k: int) -> bool:
    """Whether every GPU pool can take fresh pages for the digests of a k-page
    hit that it does not hold (they come from a cold tier), after the hit
    claims the ones it holds (which then stop being evictable)."""
    tpb = t.tokens_per_block
    for gi, pool in enumerate(t.pools):
        wanted = hashes[k - 1 : k] if t.is_state[gi] else hashes[stale_pages(t.groups[gi], k * tpb) : k]
        need = evictable = 0
        for h in wanted:
            page = pool.cached.get(h)
            if page is None:
                need += 1
            elif pool.ref[page] == 0:
                evictable += 1
        if need > pool.num_free - evictable:
            return False
    return True


SPARE_WALK = 1024  # LRU pages `create_check` looks at for `spare`: more than a few decode runs take


def create_check(
    t: PageTables,
    hashes: Sequence[int],
    memo: PromptMemo,
    known: dict[int, KnownPages],
    tier: ColdStore | None,
    positions: int,
    ids: array[int] | None = None,
) -> CreateCheck:
    """`KVCacheManager.can_create`: the longest hit of `hashes` (digested by
    `memo`, which gave `known`) and whether the pools hold it and
    `positions` more positions after it. A hit takes from each group's free
    count its cached pages that no request owns (they leave the LRU) and
    fresh pages for the digests only a cold tier holds (`claim`), as vLLM
    counts a hit before it allocates (`get_num_blocks_to_allocate`: evictable
    computed blocks count against the free ones). `spare` (when it does not
    fit): per store, the pages allocations can take (free ones, then the
    LRU's oldest) and leave the request as short of pages as it is
    (`_spare`). Changes no page; the memo remembers the hit's pages, so that
    `create` of the same prompt looks none up again. `ids`: the prompt's
    checked ids, handed back in the answer."""
    runs: dict[int, list[int]] = {}  # never-stale groups: the pages of the hit past the known ones (no tier)
    k = longest_hit(t, hashes, known, tier, runs=runs) if hashes else 0
    tpb = t.tokens_per_block
    hit = k * tpb
    need = [0] * len(t.pools)  # by the first group of each store
    claimed: dict[str, int] = {}
    found: dict[int, list[int]] = {}  # never-stale groups: the hit's pages, for `create`
    hits: list[tuple[int, int, list[int | None], Sequence[int]]] = []  # (store, first block, pages, refs) by group
    for gi, pool in enumerate(t.pools):
        taken = 0
        if k and (tier is not None or pool.store.lru_len):  # (no LRU: every cached page has an owner, none taken)
            first = k - 1 if t.is_state[gi] else stale_pages(t.groups[gi], hit)
            head = known.get(gi)  # (never-stale groups only: first is 0)
            h = 0 if head is None else min(k, len(head.pages))
            run = runs.get(gi)
            pages: list[int | None]
            if head is None and run is not None:  # the walk's own list (no copy)
                pages = cast("list[int | None]", run if len(run) == k else run[:k])
            else:
                pages = [
                    *(head.pages[:h] if head is not None else ()),
                    *(map(pool.cached.get, hashes[first + h : k]) if run is None else run[: k - h]),
                ]
            # without a tier `longest_hit` found every page (a count of None compares each page with it)
            missing = 0 if tier is None else pages.count(None)
            held_pages = [p for p in pages if p is not None] if missing else cast("list[int]", pages)
            refs = owners(pool.ref, held_pages)
            hits.append((t.store_of[gi], first, pages, refs))
            taken = refs.count(0) + missing  # the hit's pages in the LRU, and those only a tier holds
            if t.never_stale[gi] and not t.is_state[gi] and not missing:
                found[gi] = cast("list[int]", pages)
        if taken:
            claimed[pool.store.name] = claimed.get(pool.store.name, 0) + taken
        g = t.groups[gi]
        need[t.store_of[gi]] += taken + table_blocks(g, hit + positions) - table_blocks(g, hit)
    short = {p.store.name: n - p.num_free for p, n in zip(t.pools, need, strict=True) if n > p.num_free}
    if not short:  # (a request that does not fit is not created next: its pages are not remembered)
        memo.remember_hit({gi: KnownPages(p, int32_row(p)) for gi, p in found.items()}, t.pools)
        return CreateCheck(hit, short, claimed, ids=ids)
    memo.remember_hit({}, t.pools)
    tail = k - 1 if len(t.pools) == 1 else -1  # one group: evicting its hit's last page keeps it as short
    by_store: dict[int, list[tuple[int, list[int], Sequence[int]]]] = {}  # (first block, pages, refs) by group
    for si, first, pages, refs in hits if tier is None else ():  # (no tier: the pools hold every page of the hit)
        by_store.setdefault(si, []).append((first, cast("list[int]", pages), refs))
    spare = {  # with a cold tier the hit depends on the free pages (`onboard_fits`): none spared
        p.store.name: 0 if tier is not None else len(p.free_stack) + _spare(p, by_store.get(si, []), tail)
        for si, p in enumerate(t.pools)
        if t.store_of[si] == si
    }
    return CreateCheck(hit, short, claimed, spare, ids)


def int32_row(pages: list[int]) -> npt.NDArray[np.int32]:
    """`pages` as a read-only int32 row: packed by `struct` in one call (about
    half the instructions of NumPy's conversion of a list, item by item)."""
    return np.frombuffer(struct.pack(f"{len(pages)}i", *pages), np.int32)


def owners(ref: list[int], pages: list[int]) -> Sequence[int]:
    """`ref[p]` of each of `pages`: one `itemgetter` call indexes in C (a
    map of `ref.__getitem__` calls a method per page, half again the cost)."""
    return itemgetter(*pages)(ref) if len(pages) > 1 else [ref[p] for p in pages]  # (one index: no tuple)


def _spare(pool: PagePool, hits: list[tuple[int, list[int], Sequence[int]]], tail: int) -> int:
    """The LRU's oldest pages (at most `SPARE_WALK`) up to the first page of
    the hit (`hits`: first block, pages and their owner counts, by group)
    whose eviction would shrink the hit by more than that page. Evicting a
    page outside the hit leaves a page fewer free and the hit as it is;
    evicting the hit's last block (`tail`, -1: none counts) leaves a page
    fewer free and one fewer for the hit to claim: the request stays as short
    as it was either way."""
    nxt, end = pool.nxt, pool.num_pages
    n, page = 0, nxt[end]
    if tail >= 0 and hits:  # one group, whose hit's pages a release lists from the last block down: that run in C
        first, pages, _ = hits[0]
        run = pages[tail - first :: -1] if tail >= first else []
        if run and page == run[0]:  # each page of the run follows the one before it in the LRU
            # the usual case, a whole LRU of the run (a blocked head's), compared at once: the chain of m
            # pages breaks after m anyway when m is the LRU's length (its last page is followed by `end`)
            m = min(len(run), pool.store.lru_len, SPARE_WALK)
            if m > 2 and itemgetter(*run[: m - 1])(nxt) == tuple(run[1:m]):
                n = m
            else:
                links = map(eq, map(nxt.__getitem__, run), islice(run, 1, None))
                n = min(1 + len(list(takewhile(truth, links))), SPARE_WALK)
            page, tail = nxt[run[n - 1]], tail - n
    if page == end or n == SPARE_WALK:
        return n
    hit: dict[int, int] = {}  # page -> block of the hit's pages in the LRU
    for first, pages, refs in hits:
        lru = list(map(not_, refs))  # its pages no request owns
        hit.update(zip(compress(pages, lru), compress(count(first), lru), strict=True))
    if not hit:  # (so no run was found either) the walk ends at the LRU's end
        return min(pool.store.lru_len, SPARE_WALK)
    while page != end and n < SPARE_WALK:
        block = hit.get(page)
        if block is not None:
            if block != tail:
                break
            tail -= 1
        n, page = n + 1, nxt[page]
    return n
