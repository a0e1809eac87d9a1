"""Prefix reuse: finding a cached prefix for a new request, committing pages.

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

The longest k that satisfies every group wins. The functions take the slot
tables and the request record, never the manager.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import islice, takewhile

from kvpool.cache import hashing
from kvpool.cache.events import CacheUsageError
from kvpool.cache.hashing import extend_hashes, salt_seed
from kvpool.cache.prompt_memo import KnownPages, PromptMemo
from kvpool.cache.request import Request
from kvpool.cache.slots import SlotTables
from kvpool.spec.pages import pages_needed, stale_pages

__all__ = ["attach_prefix", "commit", "commit_next_page", "longest_hit", "salt_seed", "store_before_release"]


def longest_hit(t: SlotTables, hashes: Sequence[int], known: dict[int, KnownPages] | None = None) -> int:
    """Largest k <= len(hashes) such that a request can reuse k whole pages.
    `known[gi]`: leading pages of a never-stale group known to hold these
    digests (from `PromptMemo.digests`), not looked up again."""
    k = len(hashes)
    pools = t.pools
    for gi, pool in enumerate(pools):
        if t.never_stale[gi] and not t.is_state[gi]:  # the leading cached run, counted in C
            skip = len(known[gi].pages) if known and gi in known else 0
            k = min(k, skip + len(list(takewhile(pool.cached.__contains__, islice(hashes, skip, None)))))
    tpb = t.tokens_per_block
    checks = [gi for gi in range(len(pools)) if t.is_state[gi] or not t.never_stale[gi]]
    while k > 0:
        ok = True
        for gi in checks:
            cached = pools[gi].cached
            if t.is_state[gi]:
                ok = hashes[k - 1] in cached
            else:
                first = stale_pages(t.groups[gi], k * tpb)
                ok = all(h in cached for h in hashes[first:k])
            if not ok:
                break
        if ok:
            return k
        k -= 1
    return 0


def attach_prefix(t: SlotTables, req: Request, memo: PromptMemo) -> int:
    """Attach the longest cached prefix of `req.tokens` to a fresh request
    (mirrored by `SlotTables.start`); returns the reused tokens. The last
    prompt token is never reused. The prompt's digests come from `memo`
    (the pages it shares with the previous prompt are not digested again)."""
    tokens = req.tokens
    tpb = t.tokens_per_block
    if not tokens:
        return 0
    # the part shared with the last prompt, where its hit's pages still hold, needs no lookup
    req.hashes, known = memo.digests(tokens, tpb, req.seed, (len(tokens) - 1) // tpb, t.pools)
    # keep only the ids past the digested pages (at most a page): a long prompt's array, held by every
    # live request, would be fresh memory (page faults) for each one
    req.base = len(req.hashes) * tpb
    req.tokens = tokens[req.base :]
    k = longest_hit(t, req.hashes, known)
    attached: dict[int, KnownPages] = {}
    if k == 0:
        memo.remember_hit(attached, t.pools)
        return 0
    n, slot = k * tpb, req.slot
    for gi, (group, pool) in enumerate(zip(t.groups, t.pools, strict=True)):
        stale = stale_pages(group, n)
        nblk = pages_needed(group, n, n) + stale
        table = t.tables[gi]
        if nblk > table.shape[1]:
            table = t.widen(gi, nblk)
        row = table[slot]
        if t.is_state[gi]:
            page = pool.cached[req.hashes[k - 1]]
            pool.take_cached(page)
            pool.forget(page)
            row[nblk - 1] = page
        else:  # pages stale..k-1 at the row's end; only never-stale groups (stale 0) have known ones
            first = nblk - (k - stale)
            head = known.get(gi)
            h = 0 if head is None else min(k, len(head.pages))
            rest = list(map(pool.cached.__getitem__, req.hashes[stale + h : k]))
            if head is not None:
                pool.take_cached_many(islice(head.pages, h))
                row[first : first + h] = head.row[:h]
            pool.take_cached_many(rest)
            row[first + h : nblk] = rest
            if t.never_stale[gi]:
                pages = rest if head is None else head.pages[:h] + rest
                attached[gi] = KnownPages(pages, row[first:nblk].copy())
        req.nblks[gi], req.nstales[gi], req.nxts[gi] = nblk, stale, t.next_stale(gi, n)
    req.cap = req.hist = n
    t.rebound(req)
    req.committed = k
    memo.remember_hit(attached, t.pools)
    return n


def store_before_release(t: SlotTables, req: Request, history: int) -> None:
    """A resize is about to raise `req`'s history to `history` (so positions
    below it are computed) and release the pages that leave a sliding window or
    a finished chunk. Store the whole pages whose token ids are known first, so
    that they go to the cache, not the free list: a later request that shares
    only an early prefix (a system prompt) needs exactly those pages. Call only
    when the resize is known to succeed; state groups are left alone (their
    snapshots follow `commit`)."""
    if req.dummy or req.tokens is None:
        return
    cap, hist = t.shape(req)
    # only pages that exist now can be stored: those below the current capacity
    n = min(req.num_known, history, cap)
    if n // t.tokens_per_block > req.committed:
        commit(t, req, n, None, hist, computed=history)


def commit(
    t: SlotTables,
    req: Request,
    num_tokens: int,
    tokens: Sequence[int] | array[int] | None,
    hist: int,
    *,
    computed: int | None = None,
    state_snapshots: bool = False,
) -> int:
    """Store the hashes of the whole pages among the first `num_tokens`
    positions (see `KVCacheManager.commit`); `tokens` (checked token ids) are
    appended first, `hist` is the request's history. `computed` (default:
    `hist`) bounds `num_tokens`; a caller that passes it is about to raise
    history there, and state snapshots are then skipped. Without
    `state_snapshots` state groups are never snapshotted."""
    known = req.num_known
    if tokens is not None:
        known += len(tokens)
    if num_tokens > known or num_tokens > (hist if computed is None else computed):
        raise CacheUsageError(
            f"request {req.rid}: cannot commit {num_tokens} tokens: {known} token ids known, "
            f"history {hist} (commit only computed, verified tokens)"
        )
    if tokens:
        if req.tokens is None:
            req.tokens = array("q")
        req.tokens.extend(tokens)
    tpb = t.tokens_per_block
    k = num_tokens // tpb  # whole pages only
    done = req.committed
    if k <= done:  # no page completes: nothing to hash or store
        return done * tpb
    assert req.tokens is not None
    slot = req.slot
    hashes = req.hashes
    extend_hashes(hashes, req.tokens, tpb, req.seed, k, base=req.base)
    nblks = t.counts(req)[0]
    for gi, pool in enumerate(t.pools):
        nblk = nblks[gi]
        if not t.is_state[gi]:
            if nblk > done:
                pool.store_chain(t.tables[gi][slot, done : min(k, nblk)].tolist(), hashes, done, tpb)
            continue
        # a state group: its slot holds the state after exactly `hist` positions
        if (
            computed is None
            and state_snapshots
            and k * tpb == hist
            and nblk == 1
            and hashes[k - 1] not in pool.cached
            and pool.num_free
        ):
            page = pool.take(1)[0]
            source = int(t.tables[gi][slot, 0])
            pool.store(page, hashes[k - 1], hashes[k - 2] if k > 1 else None, k * tpb, source_page=source)
            pool.release([page])
    req.committed = k
    return k * tpb


def commit_next_page(t: SlotTables, req: Request) -> int:
    """`commit` of exactly one more page, `req.committed`, whose tokens are
    known and computed (the caller checked), of a mirrored request in tables
    without state groups: the decode step's commit, one digest (unless
    `create` made it) and one `store` per group. Returns the tokens now reusable."""
    k, tpb, hashes = req.committed, t.tokens_per_block, req.hashes
    if len(hashes) == k:  # past the prompt's pages: hash this one, chained to the last
        tokens = req.tokens
        assert tokens is not None
        start = k * tpb - req.base
        page = tokens[start : start + tpb].tobytes()
        hashes.append(hashing.page_digest(hashes[-1] if k else req.seed, page))
    block_hash, parent = hashes[k], hashes[k - 1] if k else None
    slot = req.slot
    for gi, n in enumerate(req.nblks):
        if n > k and (page_id := t.tables[gi].item(slot, k)) >= 0:
            t.pools[gi].store(page_id, block_hash, parent, tpb)
    req.committed = k + 1
    return (k + 1) * tpb
