"""`check_integrity`: every page is exactly one of free, owned or cached."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from kvpool.cache.events import CacheIntegrityError
from kvpool.cache.pool import PagePool
from kvpool.cache.request import Request
from kvpool.cache.suspension import Suspension
from kvpool.cache.tables import PageTables
from kvpool.cache.tiers import ColdTier
from kvpool.spec.pages import stale_pages, table_blocks


def check_integrity(t: PageTables, requests: Iterable[Request]) -> None:
    """Raise `CacheIntegrityError` naming the offending pages per group unless:
    ref counts equal the number of table entries naming each page; unowned
    pages are on the free stack (no hash) or in the LRU (hash) exactly once;
    table entries name pages of the pool; a page shared by several requests
    carries a prefix hash (only reuse shares pages);
    owned pages are in neither; the hash map and page hashes agree; every
    table matches `pages_needed`/`stale_pages` of its request's shape.

    A pool shared by several groups (`cache.shared_pool`) is checked once,
    under its name, against the owners of all its groups; a page named by two
    of its groups, or a hash held in the map of a group other than the one
    holding the page, is an error too."""
    bad: dict[str, list[int]] = {}
    reasons: list[str] = []
    reqs = list(requests)
    members: dict[int, list[int]] = {}  # store -> groups drawing from it
    for gi, s in enumerate(t.store_of):
        members.setdefault(s, []).append(gi)
    for gis in members.values():
        pool = t.pools[gis[0]]
        label = pool.store.name
        offending: set[int] = set()
        owners = _owners(t, gis, reqs, label, reasons, offending)
        _check_lists(t, gis, pool, owners, label, reasons, offending)
        if offending:
            bad[label] = sorted(offending)
    for req in reqs:
        bounds = (req.lo, req.hi, req.next_stale)
        t.rebound(req)  # recomputed from the counts, then put back as found
        if bounds != (req.lo, req.hi, req.next_stale):
            reasons.append(f"request {req.rid}: bounds {bounds} do not match its block counts")
            bad.setdefault(t.groups[0].name, [])
        req.lo, req.hi, req.next_stale = bounds
    if bad or reasons:
        raise CacheIntegrityError(
            "page bookkeeping is inconsistent: "
            + "; ".join(
                reasons or [f"{g}: pages {p} are not exactly one of free/owned/cached" for g, p in bad.items()]
            ),
            bad,
        )


def _owners(
    t: PageTables, gis: list[int], reqs: list[Request], label: str, reasons: list[str], offending: set[int]
) -> npt.NDArray[np.int64]:
    """Table entries naming each page of the pool of groups `gis`; tables that
    do not match their request's shape, entries outside the pool and pages
    named by two groups are reported."""
    n = t.pools[gis[0]].num_pages
    owners = np.zeros(n, np.int64)
    holder = np.full(n, -1, np.int64)  # the group whose tables name the page
    for gi in gis:
        group, table = t.groups[gi], t.tables[gi]
        mine = np.zeros(n, np.int64)
        for req in reqs:
            slot, nblk, nstale, cap, hist = req.slot, req.nblk[gi], req.nstale[gi], req.cap, req.hist
            row = table[slot]
            want_stale = stale_pages(group, hist)
            if (
                nstale != want_stale
                or nblk != table_blocks(group, cap)
                or req.stale_at[gi] != t.next_stale(gi, hist, want_stale)
                or (row[:nstale] != -1).any()
                or (row[nblk:] != -1).any()
                or (row[nstale:nblk] < 0).any()
            ):
                offending.update(row[row >= 0].tolist())
                reasons.append(
                    f"{group.name}: slot {slot} table {row[: nblk + 1].tolist()} does not "
                    f"match capacity {cap}, history {hist}"
                )
            live_pages = row[nstale:nblk]
            out_of_range = live_pages[(live_pages >= n) | (live_pages < -1)].tolist()
            if out_of_range:
                reasons.append(f"{group.name}: slot {slot} names pages {out_of_range} outside the pool of {n}")
                offending.update(out_of_range)
            np.add.at(mine, live_pages[(live_pages >= 0) & (live_pages < n)], 1)
        crossed = np.flatnonzero((mine > 0) & (holder >= 0)).tolist()
        if crossed:
            others = sorted({t.groups[int(holder[p])].name for p in crossed})
            reasons.append(f"{label}: pages {crossed} are named by group {group.name} and by {others}")
            offending.update(crossed)
        holder[mine > 0] = gi
        owners += mine
        view = t.pools[gi]
        if len(gis) > 1:
            foreign = [p for p in view.cached.values() if 0 <= p < n and holder[p] not in (-1, gi)]
            if foreign:
                reasons.append(f"{label}: group {group.name} caches pages {foreign} that another group holds")
                offending.update(foreign)
    return owners


def _check_lists(
    t: PageTables,
    gis: list[int],
    pool: PagePool,
    owners: npt.NDArray[np.int64],
    label: str,
    reasons: list[str],
    offending: set[int],
) -> None:
    """Ref counts against `owners`, the free stack, the LRU and the hash maps
    of one pool (the maps of every group drawing from it)."""
    ref = np.asarray(pool.ref, np.int64)
    states = any(t.groups[gi].rule.per_request for gi in gis)
    for found in (
        _refs_match(ref, owners),
        None if states else _shared_pages_hashed(pool, ref),
        _listed_once(pool),
        _one_state_each(pool, ref),
        _maps_agree(pool, [t.pools[gi].cached for gi in gis]),
    ):
        if found is not None:
            reasons.append(f"{label}: {found[0]}")
            offending.update(found[1])


# Each check below answers None, or (what is wrong, the pages it concerns).
Finding = tuple[str, list[int]] | None


def _refs_match(ref: npt.NDArray[np.int64], owners: npt.NDArray[np.int64]) -> Finding:
    wrong = np.flatnonzero(ref != owners).tolist()
    return (f"ref counts differ from owners at pages {wrong}", wrong) if wrong else None


def _shared_pages_hashed(pool: PagePool, ref: npt.NDArray[np.int64]) -> Finding:
    """Only a prefix hit shares a page, and a hit page carries its hash: a
    shared page without one means two requests write the same page (pools
    with a state group are exempt: a snapshot's source is shared by design)."""
    shared = [p for p in np.flatnonzero(ref > 1).tolist() if pool.page_hash[p] is None]
    return (f"pages {shared} are shared without a prefix hash", shared) if shared else None


def _listed_once(pool: PagePool) -> Finding:
    """No page twice on the free stack and the LRU together, and the LRU as long as it says."""
    seen: dict[int, int] = {}
    lru = pool.lru_order()
    for p in pool.free_stack + lru:
        seen[p] = seen.get(p, 0) + 1
    twice = [p for p, c in seen.items() if c > 1]
    if twice or len(lru) != pool.num_cached:
        return f"pages listed twice as free/cached: {twice}", twice
    return None


def _one_state_each(pool: PagePool, ref: npt.NDArray[np.int64]) -> Finding:
    """Every page exactly one of free (unhashed, on the stack), owned (on no
    list) or cached (hashed, on the LRU)."""
    free, lru, page_hash = set(pool.free_stack), set(pool.lru_order()), pool.page_hash
    lost = []
    for p in range(pool.num_pages):
        owned = ref[p] > 0
        if owned and (p in free or p in lru):
            lost.append(p)  # owned yet allocatable
        elif not owned and p not in free and p not in lru:
            lost.append(p)  # leaked: nobody owns it and nothing can allocate it
        elif (p in free and page_hash[p] is not None) or (p in lru and page_hash[p] is None):
            lost.append(p)  # on the wrong list for its content
    return (f"pages {lost} are not exactly one of free/owned/cached", lost) if lost else None


def _maps_agree(pool: PagePool, maps: list[dict[int, int]]) -> Finding:
    """Each hashed page is in exactly one group's map, under its own hash."""
    n, page_hash = pool.num_pages, pool.page_hash
    stale = [p for p in range(n) if page_hash[p] is not None and sum(m.get(page_hash[p] or 0) == p for m in maps) != 1]
    stale += [p for m in maps for h, p in m.items() if not 0 <= p < n or page_hash[p] != h]
    return (f"hash map and page hashes disagree at pages {stale}", stale) if stale else None


def check_tiers(
    tier: ColdTier, t: PageTables, suspended: Iterable[Request], suspensions: Mapping[int, Suspension]
) -> None:
    """Raise `CacheIntegrityError` unless, in every cold tier and group, each
    slot is exactly one of free, holding a cached digest, or pinned by a
    suspended request (as many as its live pages); no digest is cached in two
    tiers; and suspended requests hold no GPU page."""
    reasons: list[str] = []
    bad: dict[str, list[int]] = {}
    pinned: dict[str, list[list[int]]] = {}
    for s in suspensions.values():
        pinned.setdefault(s.medium, [[] for _ in t.groups])
        for gi, group_slots in enumerate(s.slots):
            pinned[s.medium][gi] += group_slots
    seen: list[set[int]] = [set() for _ in t.groups]
    for level in tier.levels():
        for gi, g in enumerate(t.groups):
            held, free = list(level.held[gi].values()), level.free[gi]
            mine = pinned.get(level.medium, [[] for _ in t.groups])[gi]
            slots = held + free + mine
            if sorted(slots) != list(range(level.pages[gi])) or len(mine) != level.pinned[gi]:
                reasons.append(f"{level.medium} {g.name}: slots are not exactly one of free, cached or pinned")
                bad.setdefault(f"{level.medium}:{g.name}", []).extend(sorted(set(range(level.pages[gi])) ^ set(slots)))
            twice = seen[gi] & level.held[gi].keys()
            if twice:
                reasons.append(f"{level.medium} {g.name}: digests cached in two tiers: {sorted(twice)}")
            seen[gi] |= level.held[gi].keys()
    for req in suspended:
        live = [req.live(gi) for gi in range(len(t.groups))]
        if [len(x) for x in suspensions[req.rid].slots] != live:
            reasons.append(f"request {req.rid}: pinned slots do not match its live pages {live}")
        if any((t.tables[gi][req.slot] != -1).any() for gi in range(len(t.groups))):
            reasons.append(f"request {req.rid}: suspended, yet its table names GPU pages")
    if reasons:
        raise CacheIntegrityError("cold tiers are inconsistent: " + "; ".join(reasons), bad)
