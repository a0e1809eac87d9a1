"""`check_integrity`: every page is exactly one of free, owned or cached."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvpool.cache.events import CacheIntegrityError
from kvpool.cache.request import Request
from kvpool.cache.slots import SlotTables
from kvpool.spec.pages import pages_needed, stale_pages


def check_integrity(t: SlotTables, requests: Iterable[Request]) -> None:
    """Raise `CacheIntegrityError` naming the offending pages per group unless:
    ref counts equal the number of table entries naming each page; unowned
    pages are on the free stack (no hash) or in the LRU (hash) exactly once;
    table entries name pages of the pool; a page shared by several requests
    carries a prefix hash (only reuse shares pages);
    owned pages are in neither; the hash map and page hashes agree; every
    table matches `pages_needed`/`stale_pages` of its request's shape."""
    bad: dict[str, list[int]] = {}
    reasons: list[str] = []
    slots = [req.slot for req in requests]
    for gi, pool in enumerate(t.pools):
        group = t.groups[gi]
        n = pool.num_pages
        owners = np.zeros(n, np.int64)
        offending: set[int] = set()
        table = t.tables[gi]
        for slot in slots:
            nblk, nstale = int(t.nblk[gi, slot]), int(t.nstale[gi, slot])
            cap, hist = int(t.cap[slot]), int(t.hist[slot])
            row = table[slot]
            want_stale = stale_pages(group, hist)
            if (
                nstale != want_stale
                or nblk != pages_needed(group, cap, hist) + want_stale
                or (row[:nstale] != -1).any()
                or (row[nblk:] != -1).any()
                or (row[nstale:nblk] < 0).any()
            ):
                live = row[row >= 0].tolist()
                offending.update(live)
                reasons.append(
                    f"{group.name}: slot {slot} table {row[: nblk + 1].tolist()} does not "
                    f"match capacity {cap}, history {hist}"
                )
            live_pages = row[nstale:nblk]
            out_of_range = live_pages[(live_pages >= n) | (live_pages < -1)].tolist()
            if out_of_range:
                reasons.append(f"{group.name}: slot {slot} names pages {out_of_range} outside the pool of {n}")
                offending.update(out_of_range)
            np.add.at(owners, live_pages[(live_pages >= 0) & (live_pages < n)], 1)
        ref = np.asarray(pool.ref, np.int64)
        wrong_ref = np.flatnonzero(ref != owners).tolist()
        if wrong_ref:
            reasons.append(f"{group.name}: ref counts differ from owners at pages {wrong_ref}")
            offending.update(wrong_ref)
        if not group.rule.per_request:
            # only a prefix hit shares a page, and a hit page carries its hash:
            # a shared page without one means two requests write the same page
            shared = [p for p in np.flatnonzero(ref > 1).tolist() if pool.page_hash[p] is None]
            if shared:
                reasons.append(f"{group.name}: pages {shared} are shared without a prefix hash")
                offending.update(shared)
        free = pool.free_stack
        lru = pool.lru_order()
        seen: dict[int, int] = {}
        for p in free + lru:
            seen[p] = seen.get(p, 0) + 1
        twice = [p for p, c in seen.items() if c > 1]
        if twice or len(lru) != pool.lru_len:
            reasons.append(f"{group.name}: pages listed twice as free/cached: {twice}")
            offending.update(twice)
        hashed = [p for p in range(n) if pool.page_hash[p] is not None]
        free_set, lru_set = set(free), set(lru)
        lost = []
        for p in range(n):
            owned = ref[p] > 0
            if owned and (p in free_set or p in lru_set):
                lost.append(p)  # owned yet allocatable
            elif not owned and p not in free_set and p not in lru_set:
                lost.append(p)  # leaked: nobody owns it and nothing can allocate it
            elif (p in free_set and pool.page_hash[p] is not None) or (p in lru_set and pool.page_hash[p] is None):
                lost.append(p)  # on the wrong list for its content
        if lost:
            reasons.append(f"{group.name}: pages {lost} are not exactly one of free/owned/cached")
            offending.update(lost)
        stale_map = [p for p in hashed if pool.cached.get(pool.page_hash[p] or 0) != p]
        stale_map += [p for h, p in pool.cached.items() if pool.page_hash[p] != h]
        if stale_map:
            reasons.append(f"{group.name}: hash map and page hashes disagree at pages {stale_map}")
            offending.update(stale_map)
        if offending:
            bad[group.name] = sorted(offending)
    if bad:
        raise CacheIntegrityError(
            "page bookkeeping is inconsistent: "
            + "; ".join(
                reasons or [f"{g}: pages {p} are not exactly one of free/owned/cached" for g, p in bad.items()]
            ),
            bad,
        )
