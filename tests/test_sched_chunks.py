"""The longest prefill chunk the pages hold: `ChunkSizer.largest` counts it
from the pages the whole chunk lacked, and that count must be exactly what
asking the manager chunk by chunk finds (`ChunkSizer.probed`, and a scan
of `can_resize` over every length), leaving the pools exactly as the probing
does, for every kind of group and for pools shared by groups."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, hybrid_spec, observed, twin_spec
from kvpool.cache import KVCacheManager
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sched import Scheduler
from shared_pool_helpers import shared_manager

TPB = 4
PROMPTS = 3  # prompt stems, so that later prompts hit pages earlier ones cached


def build(kind: str, pages: int, extra: int) -> tuple[KVCacheManager, Scheduler]:
    limits = ServingLimits(max_batch_size=8, max_seq_len=1024, num_extra_kv_tokens=extra)
    if kind == "shared":
        spec = twin_spec(tpb=TPB, window=8)
        mgr = shared_manager(spec, 2 * pages, max_batch_size=8, max_seq_len=1024, num_extra_kv_tokens=extra)
    else:
        spec = full_spec(TPB) if kind == "full" else {"hybrid": hybrid_spec, "twin": twin_spec}[kind](TPB, 8)
        sizes = {g.name: pages for g in spec.groups}
        mgr = KVCacheManager(PoolPlan.from_pages(spec, sizes, limits), state_snapshots=True)
    return mgr, Scheduler(mgr, limits, enable_reuse=True)


def prompt(stem: int, length: int) -> list[int]:
    return [100 * stem + i % 7 for i in range(length)]


def replay(mgr: KVCacheManager, ops: list[tuple[int, int, int, bool]], extra: int) -> None:
    """Requests that compute (and commit) part of a prompt and stay or leave,
    so that pages are owned, cached in the LRU, or free."""
    for rid, (stem, length, done, leave) in enumerate(ops):
        tokens = prompt(stem, length)
        hit = mgr.create(rid, tokens)
        upto = max(hit, min(length - 1, done))
        if not mgr.resize(rid, upto + 1 + extra, hit):
            mgr.free(rid)
            continue
        mgr.resize(rid, upto + 1 + extra, upto)
        mgr.commit(rid, upto)
        if leave:
            mgr.free(rid)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["full", "hybrid", "twin", "shared"]),
    pages=st.integers(3, 14),
    extra=st.integers(0, 3),
    ops=st.lists(
        st.tuples(st.integers(0, PROMPTS - 1), st.integers(2, 60), st.integers(0, 60), st.booleans()), max_size=6
    ),
    head=st.tuples(st.integers(0, PROMPTS - 1), st.integers(2, 160)),
    computed=st.integers(0, 80),
    budget=st.integers(1, 160),
)
def test_the_counted_chunk_is_the_probed_one(
    kind: str,
    pages: int,
    extra: int,
    ops: list[tuple[int, int, int, bool]],
    head: tuple[int, int],
    computed: int,
    budget: int,
) -> None:
    twins = [build(kind, pages, extra) for _ in range(2)]
    starts = []
    for mgr, _ in twins:
        replay(mgr, ops, extra)
        rid, tokens = 99, prompt(*head)
        hit = mgr.create(rid, tokens)
        # a request admitted earlier, whose history since moved up to its capacity (a running prefill's)
        h = max(hit, min(computed, len(tokens) - 1))
        if h > hit and not (mgr.resize(rid, h + extra, hit) and mgr.resize(rid, h + extra, h)):
            h = hit
        starts.append((rid, h, min(len(tokens) - h, budget)))
    (counted_mgr, counted), (probed_mgr, probed) = twins
    rid, h, chunk = starts[0]
    assert starts[1] == starts[0]
    # the oracle: every length asked of the manager, nothing changed
    holds = [m for m in range(1, chunk + 1) if probed_mgr.can_resize(rid, h + m + extra, h)]
    expected = max(holds, default=0)
    assert holds == list(range(1, expected + 1))  # (monotone: the probing's bisection is exact)

    n = counted.chunks.largest(rid, h, chunk)
    whole = probed_mgr.resize(rid, h + chunk + extra, h)
    probed_n = chunk if whole else probed.chunks.probed(rid, h, chunk, whole.short)
    assert n == probed_n == expected
    if n:
        assert counted_mgr.capacity(rid) == h + n + extra
    if kind == "shared":  # the probes took a pool's pages group by group, in steps: other ids, as many
        assert relabelled(counted_mgr) == relabelled(probed_mgr)
    else:
        assert observed(counted_mgr) == observed(probed_mgr)
    counted_mgr.check_integrity()


def relabelled(mgr: KVCacheManager) -> dict[str, Any]:
    """`observed` but for which page id holds what: shapes, pages per table
    row, and per pool the free pages and the cached digests in LRU order."""
    out: dict[str, Any] = {}
    for rid, _ in mgr.iter_requests():
        rows = [int((mgr.block_table(rid, g.name) >= 0).sum()) for g in mgr.groups]
        out[f"r{rid}"] = (mgr.capacity(rid), mgr.history(rid), rows)
    for p in mgr.pools:
        out[p.name] = (len(p.free_stack), [p.page_hash[page] for page in p.lru_order()], sorted(p.cached))
    return out


def test_a_pool_short_of_state_slots_only_fits_no_chunk() -> None:
    """A pool of a state group alone that lacks its slot: no shorter chunk
    needs fewer slots, so none fits (and the count says so without asking)."""
    mgr, sched = build("hybrid", 3, 0)
    for rid in range(3):  # three requests take the three state slots
        mgr.create(rid)
        assert mgr.resize(rid, 1, 0)
    mgr.create(9)
    assert sched.chunks.largest(9, 0, 4) == 0
    assert mgr.capacity(9) == 0


def test_a_chunk_past_the_capacity_is_probed(monkeypatch: Any) -> None:
    """A request whose capacity is already past its next chunk's first position
    (a resumed one) is answered by asking the manager, not by the count."""
    mgr, sched = build("full", 4, 0)
    mgr.create(1)
    assert mgr.resize(1, 10, 0)  # capacity 10 at history 0: 3 of the 4 pages
    asked: list[object] = []

    def counting(*args: object) -> int:
        asked.append(args)
        return 0

    monkeypatch.setattr(sched.chunks, "by_pages", counting)
    assert sched.chunks.largest(1, 0, 40) == 16  # all 4 pages
    assert not asked and mgr.capacity(1) == 16
