"""`check_integrity`: every page is exactly one of free, owned or cached."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from kvpool.cache.events import CacheIntegrityError
from kvpool.cache.pool import PagePool
from kvpool.cache.request import Request, Requests
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
        group = t.groups[gi]
        mine = np.zeros(n, np.int64)
        for req in reqs:
            live_pages = _row_checked(t, gi, req, reasons, offending)
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


def _row_checked(
    t: PageTables, gi: int, req: Request, reasons: list[str], offending: set[int]
) -> npt.NDArray[np.int64]:
    """`req`'s live entries in group `gi`'s table, once its row is checked
    against its capacity and history and its pages against the pool's range."""
    group, n = t.groups[gi], t.pools[gi].num_pages
    slot, nblk, nstale, cap, hist = req.slot, req.nblk[gi], req.nstale[gi], req.cap, req.hist
    row = t.tables[gi][slot]
    if not _row_matches(t, gi, req, row):
        offending.update(row[row >= 0].tolist())
        reasons.append(
            f"{group.name}: slot {slot} table {row[: nblk + 1].tolist()} does not match capacity {cap}, history {hist}"
        )
    live_pages: npt.NDArray[np.int64] = row[nstale:nblk]
    out_of_range = live_pages[(live_pages >= n) | (live_pages < -1)].tolist()
    if out_of_range:
        reasons.append(f"{group.name}: slot {slot} names pages {out_of_range} outside the pool of {n}")
        offending.update(out_of_range)
    return live_pages


def _row_matches(t: PageTables, gi: int, req: Request, row: npt.NDArray[np.int64]) -> bool:
    """Whether `req`'s counts in group `gi` are those of its capacity and history,
    and its row holds pages exactly between its stale and its last entry."""
    group, nblk, nstale = t.groups[gi], req.nblk[gi], req.nstale[gi]
    want_stale = stale_pages(group, req.hist)
    counts = (nstale, nblk, req.stale_at[gi]) == (
        want_stale,
        table_blocks(group, req.cap),
        t.next_stale(gi, req.hist, want_stale),
    )
    return counts and not ((row[:nstale] != -1).any() or (row[nblk:] != -1).any() or (row[nstale:nblk] < 0).any())


def _page_state_ok(owned: bool, on_free: bool, on_lru: bool, hashed: bool) -> bool:
    """An owned page is on no list (else it is allocatable); any other is on exactly
    one (else it leaked, or is listed twice): the free stack unhashed, the LRU hashed."""
    if owned:
        return not (on_free or on_lru)
    return on_free != on_lru and hashed == on_lru


def _one_state_each(pool: PagePool, ref: npt.NDArray[np.int64]) -> Finding:
    """Every page exactly one of free (unhashed, on the stack), owned (on no
    list) or cached (hashed, on the LRU)."""
    free, lru, page_hash = set(pool.free_stack), set(pool.lru_order()), pool.page_hash
    lost = [
        p
        for p in range(pool.num_pages)
        if not _page_state_ok(ref[p] > 0, p in free, p in lru, page_hash[p] is not None)
    ]
    return (f"pages {lost} are not exactly one of free/owned/cached", lost) if lost else None


def _maps_agree(pool: PagePool, maps: list[dict[int, int]]) -> Finding:
    """Each hashed page is in exactly one group's map, under its own hash."""
    n, page_hash = pool.num_pages, pool.page_hash
    stale = [p for p in range(n) if page_hash[p] is not None and _maps_naming(maps, page_hash[p], p) != 1]
    stale += [p for m in maps for h, p in m.items() if not 0 <= p < n or page_hash[p] != h]
    return (f"hash map and page hashes disagree at pages {stale}", stale) if stale else None


def _maps_naming(maps: list[dict[int, int]], block_hash: int | None, page: int) -> int:
    """How many of the groups' maps map `block_hash` to `page`."""
    return sum(m.get(block_hash or 0) == page for m in maps)


def check_lookups(registry: Requests) -> None:
    """Raise `CacheIntegrityError` unless the registry counts the pending
    prefix lookups (not yet counted in the reuse counters) its requests hold."""
    pending = sum(r.lookup is not None for r in (*registry.by_id.values(), *registry.suspended.values()))
    if pending != registry.pending_lookups:
        raise CacheIntegrityError(
            f"{pending} prefix lookups pending, the registry counts {registry.pending_lookups}", {}
        )


def check_tiers(
    tier: ColdTier, t: PageTables, suspended: Iterable[Request], suspensions: Mapping[int, Suspension]
) -> None:
    """Raise `CacheIntegrityError` unless, in every cold tier and group, each
    slot is exactly one of free, holding a cached digest, or pinned by a
    suspended request (as many as its live pages); no digest is cached in two
    tiers; and suspended requests hold no GPU page."""
    reasons: list[str] = []
    bad: dict[str, list[int]] = {}
    pinned = _pinned_slots(suspensions, len(t.groups))
    seen: list[set[int]] = [set() for _ in t.groups]
    for level in tier.levels():
        for gi, g in enumerate(t.groups):
            mine = pinned.get(level.medium, [[] for _ in t.groups])[gi]
            wrong = _slots_wrong(level, gi, mine)
            if wrong is not None:
                reasons.append(f"{level.medium} {g.name}: slots are not exactly one of free, cached or pinned")
                bad.setdefault(f"{level.medium}:{g.name}", []).extend(wrong)
            twice = seen[gi] & level.held[gi].keys()
            if twice:
                reasons.append(f"{level.medium} {g.name}: digests cached in two tiers: {sorted(twice)}")
            seen[gi] |= level.held[gi].keys()
    reasons += [r for req in suspended for r in _suspended_wrong(t, req, suspensions[req.rid])]
    if reasons:
        raise CacheIntegrityError("cold tiers are inconsistent: " + "; ".join(reasons), bad)


def _pinned_slots(suspensions: Mapping[int, Suspension], groups: int) -> dict[str, list[list[int]]]:
    """Per tier medium and group, the slots suspended requests pin."""
    pinned: dict[str, list[list[int]]] = {}
    for s in suspensions.values():
        pinned.setdefault(s.medium, [[] for _ in range(groups)])
        for gi, group_slots in enumerate(s.slots):
            pinned[s.medium][gi] += group_slots
    return pinned


def _slots_wrong(level: ColdTier, gi: int, mine: list[int]) -> list[int] | None:
    """The slots of group `gi` in `level` that are not exactly one of free, cached
    or pinned (`mine`), or None when all are and the pin count agrees."""
    slots = list(level.held[gi].values()) + level.free[gi] + mine
    if sorted(slots) == list(range(level.pages[gi])) and len(mine) == level.pinned[gi]:
        return None
    return sorted(set(range(level.pages[gi])) ^ set(slots))


def _suspended_wrong(t: PageTables, req: Request, parked: Suspension) -> list[str]:
    """What is wrong with suspended `req`: pins that do not match its live pages, or GPU pages."""
    live = [req.live(gi) for gi in range(len(t.groups))]
    out = []
    if [len(x) for x in parked.slots] != live:
        out.append(f"request {req.rid}: pinned slots do not match its live pages {live}")
    if any((t.tables[gi][req.slot] != -1).any() for gi in range(len(t.groups))):
        out.append(f"request {req.rid}: suspended, yet its table names GPU pages")
    return out
