"""The early returns of the one move and lazy events (cache/manager.py,
cache/events.py): a single resize gives the same pages as the batch path, a
step that moves no page plans nothing, and page events cost nothing when off
and are built only when taken."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, hybrid_spec, manager, twin_spec
from kvpool.cache import CacheEvent, KVCacheManager, events
from kvpool.cache.tables import PageTables
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec.pages import stale_pages, table_blocks

PROMPTS = [list(range(1000 * i, 1000 * i + 70)) for i in range(1, 5)]


def shapes_and_tables(m: KVCacheManager) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for rid, _ in m.iter_requests():
        out[rid] = (m.capacity(rid), m.history(rid), [m.block_table(rid, g.name).tolist() for g in m.groups])
    out["free"] = [m.free_pages(g.name) for g in m.groups]
    return out


# each step: (request index, capacity growth, history growth up to capacity)
steps = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(steps=steps, reuse=st.booleans())
def test_single_resizes_move_pages_as_the_batch_path(steps: list[tuple[int, int, int]], reuse: bool) -> None:
    pages = {"full": 60, "sliding": 60, "linear_state": 8}
    one, many = (manager(hybrid_spec(tpb=4, window=10), pages, reuse=reuse) for _ in range(2))
    for m in (one, many):
        for rid, prompt in enumerate(PROMPTS):
            m.create(rid, prompt)
    for rid, grow, done in steps:
        cap = one.capacity(rid) + grow
        hist = min(cap, one.history(rid) + done)
        a = one.resize(rid, cap, hist)  # the single path
        b = many.resize_many([rid], [cap], [hist])  # the batch path
        assert a == b
        assert shapes_and_tables(one) == shapes_and_tables(many)
    one.check_integrity()
    many.check_integrity()
    assert shapes_and_tables(one) == shapes_and_tables(many)


def test_a_batch_move_after_single_ones_starts_from_their_shape() -> None:
    m = manager(full_spec(tpb=16), {"full": 40})
    m.create(1)
    assert m.resize(1, 20, 0)
    for n in range(21, 30):  # within the second page: the early return alone moves
        assert m.resize(1, n, n - 1)
    assert (m.capacity(1), m.history(1)) == (29, 28)
    assert m.live_pages(1, "full") == 2  # ceil(29 / 16)
    assert m.extend([1], 4)  # a batch move after single ones
    assert (m.capacity(1), m.history(1)) == (33, 32)
    assert m.block_table(1, "full").tolist() == [0, 1, 2]
    m.check_integrity()


def test_only_steps_that_move_a_page_leave_the_early_return(monkeypatch: pytest.MonkeyPatch) -> None:
    # 200 decode steps over 16-token pages, a sliding window of 40: a step appends a page or is
    # planned exactly when `table_blocks` or `stale_pages` changes in some group; the rest take the
    # early return and neither
    spec = twin_spec(tpb=16, window=40)
    m = manager(spec, {"full": 64, "sliding": 16})
    m.create(0, list(range(100, 170)))
    assert m.resize(0, 71, 70)
    moved: list[int] = []
    real_plan, real_cross = PageTables.plan, PageTables.cross

    def plan(self: PageTables, req: Any, cap: int, hist: int) -> Any:
        moved.append(cap)
        return real_plan(self, req, cap, hist)

    def cross(self: PageTables, rows: Any) -> bool:
        crossed = real_cross(self, rows)
        if crossed:
            moved.extend(cap for _, cap, _ in rows)
        return crossed

    monkeypatch.setattr(PageTables, "plan", plan)
    monkeypatch.setattr(PageTables, "cross", cross)
    expected = []
    for step in range(1, 201):
        cap, hist = 71 + step, 70 + step
        if any(
            (table_blocks(g, cap), stale_pages(g, hist)) != (table_blocks(g, cap - 1), stale_pages(g, hist - 1))
            for g in spec.groups
        ):
            expected.append(cap)
        assert m.resize(0, cap, hist) if step % 2 else m.extend([0])
    assert moved == expected and 0 < len(expected) < 40
    m.check_integrity()


def test_a_pending_lookup_is_counted_by_a_resize_that_moves_nothing() -> None:
    m = manager(full_spec(tpb=16), {"full": 40})
    m.create(1, PROMPTS[0])
    assert m.resize(1, 71, 70)
    m.commit(1, 70)
    assert m.create(2, PROMPTS[0]) == 64
    assert m.resize(2, 64, 64)  # same shape as the hit: no page moves, the lookup still counts
    s = m.stats()
    assert (s.reuse_queried_tokens, s.reuse_hit_tokens) == (140, 64)


def workload(m: KVCacheManager) -> list[int]:
    """Admissions that hit, commits, evictions; returns the hits.

    12 pages of 16, prompts of 70 tokens (5 pages, 4 whole): P0 stores 4; P0
    again hits 4 (64 tokens) and stores none; P1 stores 4; P2 takes the 4 free
    pages and evicts P0's 4th page (the LRU tail of a released table goes
    first), stores 4; P0 then hits 3 pages (48), evicts P1's 4th page for its
    5th block and stores its 4th page again: 13 stored, 2 removed."""
    hits = []
    for rid, prompt in enumerate([PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]]):
        hit = m.create(rid, prompt)
        hits.append(hit)
        assert m.resize(rid, len(prompt) + 1, len(prompt))
        m.commit(rid, len(prompt))
        m.free(rid)
    return hits


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts `CacheEvent` objects built from now on (one list entry each)."""
    made: list[int] = []
    real_new = CacheEvent.__new__

    def counting_new(cls: type[CacheEvent], *args: Any, **kwargs: Any) -> CacheEvent:
        made.append(1)
        return real_new(cls, *args, **kwargs)

    monkeypatch.setattr(CacheEvent, "__new__", counting_new)
    return made


def make(events_on: bool) -> KVCacheManager:
    # 12 pages of 16: the later prompts evict the earlier ones' cached pages
    plan = PoolPlan.from_pages(full_spec(tpb=16), {"full": 12}, ServingLimits(max_batch_size=8, max_seq_len=4096))
    return KVCacheManager(plan, events=events_on)


def test_events_off_builds_and_records_nothing(built: list[int]) -> None:
    m = make(False)
    hits = workload(m)
    assert len(m.events) == 0 and not built
    assert m.take_events() == [] and not built
    assert hits == [0, 64, 0, 0, 48]  # reuse itself is unchanged (see `workload`)
    m.check_integrity()


def test_events_on_are_built_only_when_taken(built: list[int]) -> None:
    m = make(True)
    workload(m)
    assert not built  # the pools logged records, no event objects
    records = len(m.events)
    taken = m.take_events()
    assert len(built) == len(taken) > records  # several pages per record
    stored = [e for e in taken if e.kind == "stored"]
    removed = [e for e in taken if e.kind == "removed"]
    assert (len(stored), len(removed)) == (13, 2)  # see `workload`
    assert {e.block_hash for e in removed} <= {e.block_hash for e in stored}
    assert m.take_events() == [] and len(m.events) == 0


def test_recorded_runs_expand_to_chained_events() -> None:
    recs: list[events.EventRecord] = [
        ("stored", "full", [11, 12, 13], None, [0, 1, 2], 16, None),
        ("removed", "full", [11], [0]),
    ]
    assert events.expand(recs) == [
        CacheEvent("stored", "full", 11, None, 0, 16),
        CacheEvent("stored", "full", 12, 11, 1, 16),
        CacheEvent("stored", "full", 13, 12, 2, 16),
        CacheEvent("removed", "full", 11, None, 0, 0),
    ]
