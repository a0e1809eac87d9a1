"""The prefix cache's pages: attaching a hit's pages to a fresh request
(`attach_prefix`, which claims them, copying in from a cold tier what only it
holds), and offering a request's computed pages for reuse (`commit`,
`store_before_release`, `store_leaving`, state snapshots). Which hit a prompt has, and whether
it fits, is `cache/prefix_hit.py`, with each group's rule for a hit.

Page digests are chained (`cache/hashing.py`); the last prompt's are
remembered (`cache/prompt_memo.py`). The functions take the page tables and
the request record, never the manager.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from kvpool.cache.cold import ColdStore
from kvpool.cache.events import CacheUsageError
from kvpool.cache.hashing import extend_hashes
from kvpool.cache.prefix_hit import longest_hit
from kvpool.cache.prompt_memo import KnownPages, PromptMemo
from kvpool.cache.request import Request
from kvpool.cache.tables import PageTables
from kvpool.spec.pages import stale_pages, table_blocks


def claim(t: PageTables, gi: int, req: Request, first: int, k: int, tier: ColdStore | None) -> list[int]:
    """The pages holding `req.hashes[first:k]` for a hit, each with one more
    owner: the GPU pool's own, then fresh pages (`take`) for the digests only
    a cold tier holds, stored under them (the engine copies them in; the tier
    keeps its copy)."""
    hashes = req.hashes
    pool = t.pools[gi]
    if tier is None:
        pages = list(map(pool.cached.__getitem__, hashes[first:k]))
        pool.take_cached(pages)
        return pages
    found = [pool.cached.get(h, -1) for h in hashes[first:k]]
    pool.take_cached(p for p in found if p >= 0)
    missing = [i for i, p in enumerate(found) if p < 0]
    if not missing:
        return found
    pages = tier.onboard(gi, [hashes[first + i] for i in missing], pool.take)  # `longest_hit` found them
    for i, page in zip(missing, pages, strict=True):
        found[i] = page
        ahead = lookahead(req)
        ids = page_ids(t, req, first + i, None, ahead)
        pool.store_run((page,), hashes, first + i, t.tokens_per_block, None, ids, req.salt, ahead)
    return found


def lookahead(req: Request) -> int:
    """The token ids after each page that `req`'s page digests cover (`LookaheadChain`), 0 for none."""
    return 0 if req.chain is None else getattr(req.chain, "ahead", 0)


def page_ids(t: PageTables, req: Request, block: int, end: int | None = None, ahead: int = 0) -> array[int] | None:
    """The token ids of blocks `block`..`end` (default: that one block) of
    `req` and the `ahead` ids after them (a lookahead digest's), for the
    events; None when no event is recorded (the ids below `req.base` are not
    kept then)."""
    tpb, base = t.tokens_per_block, req.base
    if not t.pools[0].record_events or req.tokens is None or block * tpb < base:
        return None
    return req.tokens[block * tpb - base : (block + 1 if end is None else end) * tpb + ahead - base]


def attach_prefix(
    t: PageTables,
    req: Request,
    memo: PromptMemo,
    tier: ColdStore | None = None,
    before_copies: Callable[[], object] | None = None,
) -> int:
    """Attach the longest cached prefix of `req.tokens` to a fresh request;
    returns the reused tokens. The last prompt token is never reused. The
    prompt's digests come from `memo` (the pages it shares with the previous
    prompt are not digested again). With a cold `tier`, digests only it holds
    are copied into fresh GPU pages (`claim`), within what the pools hold;
    `before_copies` is called before anything changes when the engine's copies
    may run (the manager saves its books then, to undo a copy that raises)."""
    tokens = req.tokens
    tpb = t.tokens_per_block
    if not tokens:
        return 0
    # the part shared with the last prompt, where its hit's pages still hold, needs no lookup
    req.hashes, known = memo.digests(tokens, tpb, req.seed, (len(tokens) - 1) // tpb, t.pools, req.chain)
    # keep only the ids past the digested pages (at most a page): a long prompt's array, held by every
    # live request, would be fresh memory (page faults) for each one; unless events are recorded, which
    # name every stored page's ids
    if not t.pools[0].record_events:
        req.base = len(req.hashes) * tpb
        req.tokens = tokens[req.base :]
    k = longest_hit(t, req.hashes, known, tier)
    attached: dict[int, KnownPages] = {}
    if k == 0:
        memo.remember_hit(attached, t.pools)
        return 0
    n = k * tpb
    copies = before_copies is not None and tier is not None and tier.copying
    if copies and any(h not in pool.cached for pool in t.pools for h in req.hashes[:k]):  # a page from a tier
        assert before_copies is not None
        before_copies()
    for gi in range(len(t.pools)):
        held = attach_group(t, req, gi, k, known.get(gi), tier)
        if held is not None:
            attached[gi] = held
    req.cap = req.hist = n
    t.rebound(req)
    req.committed = k
    memo.remember_hit(attached, t.pools)
    return n


def attach_group(
    t: PageTables, req: Request, gi: int, k: int, head: KnownPages | None, tier: ColdStore | None
) -> KnownPages | None:
    """Group `gi`'s part of `attach_prefix`: the pages of the hit's first `k`
    blocks that the group keeps, written into `req`'s fresh row (`head`: its
    leading pages known to hold them, `PromptMemo.digests`); returns the
    pages a never-stale group's hit holds, for the memo (else None)."""
    group, pool = t.groups[gi], t.pools[gi]
    n = k * t.tokens_per_block
    nblk, stale = table_blocks(group, n), stale_pages(group, n)
    row = t.fresh_row(req, gi, nblk)
    kept = None
    if t.is_state[gi]:  # the snapshot becomes the request's own state slot
        (page,) = claim(t, gi, req, k - 1, k, tier)
        pool.forget(page)
        row[0] = page
    else:  # pages stale..k-1 at the row's end; only never-stale groups (stale 0) have known ones
        first = nblk - (k - stale)
        h = 0 if head is None else min(k, len(head.pages))
        held = [] if head is None else head.pages if h == len(head.pages) else head.pages[:h]
        if head is not None:
            pool.take_cached(held)  # (a list: an islice of it costs a tenth more per page)
            row[first : first + h] = head.row[:h]
        if head is not None and h == len(head.pages) == k:  # known pages are the whole hit: kept as they are
            kept = head  # (create after can_create: its row holds what the table now holds)
        else:
            rest = claim(t, gi, req, stale + h, k, tier)
            row[first + h : nblk] = rest
            if t.never_stale[gi]:
                kept = KnownPages(rest if head is None else held + rest, row[first:nblk].copy())
    t.set_counts(req, gi, nblk, stale, n)
    return kept


def store_before_release(t: PageTables, req: Request, history: int) -> None:
    """A move is about to raise `req`'s history to `history` (so positions
    below it are computed) and release the pages that leave a sliding window or
    a finished chunk. Store the whole pages whose token ids are known first, so
    that they go to the cache, not the free list: a later request that shares
    only an early prefix (a system prompt) needs exactly those pages. Call only
    when the move is known to succeed; state groups are left alone (their
    snapshots follow `commit`, which still takes them at a later commit)."""
    if req.dummy or req.tokens is None:
        return
    # only pages that exist now can be stored: those below the current capacity
    n = min(req.num_known, history, req.cap)
    if n // t.tokens_per_block > req.committed:
        commit(t, req, n, None, computed=history)


def store_leaving(t: PageTables, rows: Sequence[tuple[Request, int, int]]) -> None:
    """Store the known whole pages of requests whose history reaches a
    window's edge before their move releases them (reuse on): the tables'
    `before_release` hook."""
    for req, _, hist in rows:
        if hist >= req.next_stale and req.tokens is not None:
            store_before_release(t, req, hist)  # hashes only: the move stays valid


def commit(
    t: PageTables,
    req: Request,
    num_tokens: int,
    tokens: Sequence[int] | None,
    *,
    computed: int | None = None,
    state_snapshots: bool = False,
) -> int:
    """Store the hashes of the whole pages among the first `num_tokens`
    positions (see `KVCacheManager.commit`); `tokens` (checked token ids) are
    appended first. `computed` (default: the request's history) bounds
    `num_tokens`; a caller that passes it is about to raise history there, and
    state snapshots are then skipped. With `state_snapshots`, a state group's
    slot is snapshotted when `num_tokens` is a whole number of pages equal to
    the history, whether or not those pages were stored earlier. Returns the
    tokens now reusable."""
    ids = req.tokens
    known = (0 if ids is None else req.base + len(ids)) + (len(tokens) if tokens is not None else 0)
    if num_tokens > known or num_tokens > (req.hist if computed is None else computed):
        raise CacheUsageError(
            f"request {req.rid}: cannot commit {num_tokens} tokens: {known} token ids known, "
            f"history {req.hist} (commit only computed, verified tokens)"
        )
    if tokens:
        if ids is None:
            ids = req.tokens = array("q")
        ids.extend(tokens)
    tpb = t.tokens_per_block
    k = num_tokens // tpb  # whole pages only
    done = req.committed
    if k > done:
        assert ids is not None
        hashes, slot = req.hashes, req.slot
        if req.ahead is not None:
            take_ahead(req, ids, tpb, k)
        if len(hashes) < k:  # (a run's digests came with `take_ahead`)
            extend_hashes(hashes, ids, tpb, req.seed, k, req.chain, req.base)
        ahead = lookahead(req)
        if ahead:  # lookahead digests: only the pages whose following ids are known
            k = min(k, len(hashes))
    if k > done:
        for gi, pool in enumerate(t.pools):
            nblk = req.nblk[gi]
            if nblk > done and not t.is_state[gi]:  # one page (a decode step's): no slice
                pages = [t.rows[gi][slot][done]] if k == done + 1 else t.tables[gi][slot, done : min(k, nblk)].tolist()
                if done and t.never_stale[gi] and hashes[done - 1] not in pool.cached:
                    adopt(t, req, gi, done)
                if pool.record_events:
                    ids_of = page_ids(t, req, done, done + len(pages), ahead)
                    pool.store_run(pages, hashes, done, tpb, None, ids_of, req.salt, ahead)
                else:
                    pool.store_run(pages, hashes, done, tpb)
        req.committed = done = k
    if state_snapshots and computed is None and k and k * tpb == req.hist:
        snapshot_states(t, req, k)
    return done * tpb


def first_shared_fill(t: PageTables, req: Request, ids: Sequence[int], upto: int) -> int | None:
    """The first history at which `req`, its history growing to `upto` with
    token ids `ids` after the `num_known` it has, fills a page whose commit
    would meet a digest that a page other than its own holds: the page's own
    digest cached in a pool (`commit` then stores no copy), or, for the first
    page, its parent's digest held by another page of a never-stale group
    (`commit` stores `req`'s copy, `adopt`, should that page be evicted
    first, or for the pages before it that `adopt` walks back over). Such a
    commit depends on the evictions made before it; the other
    pages `req` fills are stored whatever the pools evict meanwhile. None when
    no page up to `upto` is such. Changes no page; the digests it computed are
    kept for `commit` (`take_ahead`), which takes those whose ids came."""
    tpb, first = t.tokens_per_block, req.committed  # pages below `first` are committed
    if req.tokens is None:
        return None
    last = min(upto, req.base + len(req.tokens) + len(ids)) // tpb  # pages first..last-1 fill on the way
    if last <= first:
        return None
    at = max((first + 1) * tpb, req.hist + 1)  # the history at which the first page's commit comes
    start = first * tpb - req.base
    if lookahead(req) or start < 0 or len(req.hashes) < first:  # (not met by runs of decode steps): be safe
        return at
    # `adopt`'s walk back from the parent, as the first commit makes it
    for gi, pool in enumerate(t.pools) if first else ():
        if not t.never_stale[gi] or t.is_state[gi]:
            continue
        cached, row, page_hash, j = pool.cached, t.rows[gi][req.slot], pool.page_hash, first - 1
        while j >= 0:
            page, holder = row[j], cached.get(req.hashes[j])
            if holder is not None and holder != page:  # another page's: where it is evicted first, the walk goes on
                return at
            if holder is not None or page < 0 or page_hash[page] is not None:  # the walk stops here
                break
            j -= 1
    data = req.tokens[start:]  # (a new array)
    data.extend(ids)
    digests = req.hashes[first - 1 : first] if first else []  # the parent, then the pages' own
    extend_hashes(digests, data, tpb, req.seed, len(digests) + last - first, req.chain, len(digests) * tpb)
    own = digests[1:] if first else digests
    req.ahead = (first, digests[0] if first else 0, data, own)  # `commit` takes them (`data` may run on past them)
    filled = len(own)  # the first page whose digest a pool holds, of those found so far
    for gi, pool in enumerate(t.pools):
        if not t.is_state[gi]:
            cached = pool.cached
            for j in range(filled):
                if own[j] in cached:
                    filled = j
                    break
    return None if filled == len(own) else max((first + filled + 1) * tpb, at)


def take_ahead(req: Request, ids: array[int], tpb: int, k: int) -> None:
    """Append to `req.hashes` the digests `first_shared_fill` computed ahead
    for its next pages (up to page k) whose ids `ids` (positions `req.base`...)
    now hold, rather than hashing them again; keeps the rest for a later commit."""
    assert req.ahead is not None
    first, parent, data, digests = req.ahead
    hashes = req.hashes
    req.ahead = None
    if first != len(hashes) or (first and hashes[-1] != parent):
        return
    m, start = min(k - first, len(digests)), first * tpb - req.base
    if m <= 0 or ids[start : start + m * tpb] != data[: m * tpb]:
        return
    hashes += digests[:m]
    if m < len(digests):
        req.ahead = (first + m, digests[m - 1], data[m * tpb :], digests[m:])


def adopt(t: PageTables, req: Request, gi: int, done: int) -> None:
    """Before storing pages `done`.. of `req` in group `gi`: the page before
    them left the GPU. That happens when the request's own page
    held a copy of a digest another page stored first (two requests computed
    one prefix at once) and that page was evicted. Store the request's own
    copies of the digests the GPU lost, last ones first back to one the GPU
    holds, so that every stored page's parent is on the GPU (as a router's
    tree of GPU blocks must have it: Dynamo refuses a block whose parent it
    does not hold in that tier or a warmer one)."""
    pool, row = t.pools[gi], t.rows[gi][req.slot]
    first = done
    while first > 0 and req.hashes[first - 1] not in pool.cached:
        page = row[first - 1]
        if page < 0 or pool.page_hash[page] is not None:
            break
        first -= 1
    if first < done:
        pages = [row[j] for j in range(first, done)]
        ahead = lookahead(req)
        ids = page_ids(t, req, first, done, ahead)
        pool.store_run(pages, req.hashes, first, t.tokens_per_block, None, ids, req.salt, ahead)


def snapshot_states(t: PageTables, req: Request, k: int) -> None:
    """Copy (as bookkeeping: a `stored` event naming the source slot) each
    state group's slot of `req`, whose history is exactly k pages, into a
    cached page under the k-th page's digest, so a later request with this
    prefix can resume from it; skipped where the snapshot exists or no page is free."""
    block_hash = req.hashes[k - 1]
    for gi, pool in enumerate(t.pools):
        if t.is_state[gi] and req.nblk[gi] == 1 and block_hash not in pool.cached and pool.num_free:
            page = pool.take(1)[0]
            source = t.tables[gi].item(req.slot, 0)
            ahead = lookahead(req)
            ids = page_ids(t, req, k - 1, None, ahead)
            pool.store_run([page], req.hashes, k - 1, k * t.tokens_per_block, source, ids, req.salt, ahead)
            pool.release([page])
