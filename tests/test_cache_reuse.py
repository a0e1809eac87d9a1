"""Prefix reuse: commit, hits, the last-token rule, salts, LRU eviction,
per-group rules (sliding needs only the window, state needs a snapshot)."""

from __future__ import annotations

from array import array

import pytest

from cache_helpers import assert_table, full_spec, hybrid_spec, manager, snapshot, twin_spec
from kvpool.cache import STALE, CacheUsageError, KVCacheManager

PROMPT = list(range(1000, 1100))  # 100 tokens = 6 whole pages of 16 + 4


def prefilled(m: KVCacheManager, rid: int, tokens: list[int], salt: str | None = None) -> int:
    """Admit `tokens`, compute them all (history = len), commit them."""
    hit = m.create(rid, tokens, salt=salt)
    assert m.resize(rid, len(tokens) + 1, len(tokens))
    m.commit(rid, len(tokens))
    return hit


def test_commit_then_hit_shares_whole_pages() -> None:
    m = manager(full_spec(tpb=16), {"full": 20})
    assert prefilled(m, 1, PROMPT) == 0
    # capacity 101 -> 7 pages; 100 // 16 = 6 whole pages committed
    events = m.take_events()
    assert [(e.kind, e.page, e.num_tokens) for e in events] == [("stored", p, 16) for p in range(6)]
    assert [e.parent_hash for e in events[1:]] == [e.block_hash for e in events[:-1]]
    assert events[0].parent_hash is None
    # the same prompt: (100 - 1) // 16 = 6 pages reusable -> 96 tokens
    assert m.create(2, PROMPT) == 96
    assert_table(m, 2, "full", [0, 1, 2, 3, 4, 5])
    assert (m.capacity(2), m.history(2)) == (96, 96)
    assert m.free_pages("full") == 20 - 7  # shared pages are not taken twice
    # a lookup counts once the request is admitted (its first resize succeeds)
    assert (m.stats().reuse_queried_tokens, m.stats().reuse_hit_tokens) == (100, 0)
    assert m.resize(2, 101, 96)
    s = m.stats()
    assert (s.reuse_queried_tokens, s.reuse_hit_tokens) == (200, 96)
    m.check_integrity()


def test_lookups_of_requests_freed_before_admission_do_not_count() -> None:
    # a scheduler that creates the queue head, finds no room and frees it again,
    # step after step, must not inflate the reuse counters
    m = manager(full_spec(tpb=16), {"full": 20})
    prefilled(m, 1, PROMPT)
    for _ in range(3):
        assert m.create(2, PROMPT) == 96
        m.free(2)
    s = m.stats()
    assert (s.reuse_queried_tokens, s.reuse_hit_tokens) == (100, 0)


def test_last_prompt_token_is_never_reused() -> None:
    m = manager(full_spec(tpb=16), {"full": 20})
    prefilled(m, 1, PROMPT)
    # a 96-token prompt is 6 whole pages, but its last token must be computed:
    # (96 - 1) // 16 = 5 pages -> 80 tokens
    assert m.create(2, PROMPT[:96]) == 80
    assert m.create(3, PROMPT[:97]) == 96


def test_divergence_inside_a_page_stops_the_hit_before_it() -> None:
    m = manager(full_spec(tpb=16), {"full": 20})
    prefilled(m, 1, PROMPT)
    other = PROMPT[:40] + [7] + PROMPT[41:]  # differs at position 40, inside page 2 (32..47)
    assert m.create(2, other) == 32


def test_salt_separates_tenants() -> None:
    m = manager(full_spec(tpb=16), {"full": 30})
    prefilled(m, 1, PROMPT, salt="tenant-a")
    assert m.create(2, PROMPT) == 0
    assert m.create(3, PROMPT, salt="tenant-b") == 0
    assert m.create(4, PROMPT, salt="tenant-a") == 96


def test_freed_pages_stay_cached_and_are_evicted_tail_first() -> None:
    m = manager(full_spec(tpb=16), {"full": 8})
    prefilled(m, 1, PROMPT)  # 7 pages (0..6), 0..5 hashed
    m.take_events()
    m.free(1)
    s = m.stats().groups["full"]
    assert (s.free, s.cached, s.used) == (8, 6, 0)
    # a new request needing 4 pages: the 2 unhashed pages (6 and 7) first, then the
    # 2 least recently released cached ones; freeing walks the table backwards,
    # so those are the prefix's tail pages 5 and 4
    m.create(2, [1, 2, 3])
    assert m.resize(2, 64, 0)
    removed = m.take_events()
    assert [(e.kind, e.page) for e in removed] == [("removed", 5), ("removed", 4)]
    assert sorted(m.block_table(2, "full").tolist()) == [4, 5, 6, 7]
    assert m.create(3, PROMPT) == 64  # pages 0..3 survived
    m.check_integrity()


def test_reuse_off_ignores_tokens() -> None:
    m = manager(full_spec(tpb=16), {"full": 20}, reuse=False)
    assert prefilled(m, 1, PROMPT) == 0
    assert m.create(2, PROMPT) == 0 and m.take_events() == []
    assert m.commit(2, 0) == 0


def test_commit_checks_history_and_takes_generated_tokens() -> None:
    m = manager(full_spec(tpb=16), {"full": 20})
    m.create(1, PROMPT[:20])
    assert m.resize(1, 21, 20)
    with pytest.raises(CacheUsageError, match="cannot commit 21"):
        m.commit(1, 21)  # beyond history (and beyond known tokens)
    assert m.commit(1, 20) == 16
    assert m.resize(1, 33, 32)
    assert m.commit(1, 32, tokens=PROMPT[20:32]) == 32  # 12 generated tokens appended
    assert m.create(2, PROMPT[:33]) == 32
    m.create(3)
    assert m.resize(3, 16, 16)
    with pytest.raises(CacheUsageError):
        m.commit(3, 16)  # no token ids known


def test_packed_ids_commit_as_a_list_of_them_does() -> None:
    """Ids handed over packed (an int64 array, as the scheduler does) take
    `commit`'s early return when no page completes: the manager ends as the
    list's slow path leaves it; a negative packed id is refused, nothing kept."""
    ends = []
    for ids in (PROMPT[20:30], array("q", PROMPT[20:30])):
        m = manager(full_spec(tpb=16), {"full": 20})
        m.create(1, PROMPT[:20])
        assert m.resize(1, 33, 30)
        assert m.commit(1, 0, ids) == 0  # ids only: page 1 (positions 16..31) is not complete
        with pytest.raises(CacheUsageError, match="negative"):
            m.commit(1, 0, array("q", [5, -1]))
        assert m.commit(1, 30, (PROMPT[30],)) == 16
        assert m.resize(1, 33, 32)
        assert m.commit(1, 32, [PROMPT[31]]) == 32
        ends.append(snapshot(m))
    assert ends[0] == ends[1]
    assert ends[1]["observed"]["full"][1][1] is not None  # the second page was stored from the packed ids


def test_sliding_group_needs_only_the_last_window_of_a_hit() -> None:
    m = manager(twin_spec(tpb=16, window=40), {"full": 20, "sliding": 20})
    prefilled(m, 1, PROMPT)
    # at history 100 request 1 holds sliding blocks floor((100+1-40)/16) = 3 .. 6, so
    # blocks 0..2 were never stored there; a 96-token hit needs blocks
    # floor((96+1-40)/16) = 3 .. 5 only
    assert m.create(2, PROMPT) == 96
    assert_table(m, 2, "sliding", [STALE, STALE, STALE] + m.block_table(1, "sliding")[3:6].tolist())
    assert m.live_pages(2, "sliding") == 3 and m.live_pages(2, "full") == 6
    m.check_integrity()


def test_pages_leaving_the_window_stay_reusable() -> None:
    # Prefill 64 of the 100 tokens (4 pages), then raise history to 64: sliding
    # pages [0, floor((64 + 1 - 40)/16)) = 0..0 leave the window. They are stored
    # before release, so a request sharing only the first 48 tokens hits them:
    # 2 whole pages (the last prompt token is never reused), sliding pages
    # floor((32 + 1 - 40)/16) = 0 .. 1 needed.
    m = manager(twin_spec(tpb=16, window=40), {"full": 20, "sliding": 20})
    m.create(1, PROMPT)
    assert m.resize(1, 64, 0)
    first_sliding_page = int(m.block_table(1, "sliding")[0])
    assert m.resize(1, 64, 64)
    assert m.block_table(1, "sliding")[0] == STALE
    assert m.stats().groups["sliding"].cached >= 1
    assert m.create(2, PROMPT[:33]) == 32
    assert int(m.block_table(2, "sliding")[0]) == first_sliding_page
    m.check_integrity()


def test_refused_resize_stores_nothing_before_release() -> None:
    # the history raise would release sliding page 0, but the full pool cannot
    # grow to 80 positions (5 pages, 4 in the pool): nothing may change
    m = manager(twin_spec(tpb=16, window=40), {"full": 4, "sliding": 20})
    m.create(1, PROMPT)
    assert m.resize(1, 64, 0)
    m.take_events()
    assert not m.resize(1, 80, 64)
    assert m.take_events() == [] and m.stats().groups["sliding"].cached == 0
    assert m.history(1) == 0 and m.block_table(1, "sliding")[0] != STALE
    m.check_integrity()


def test_state_group_reuses_only_a_snapshot_at_the_hit() -> None:
    m = manager(hybrid_spec(tpb=16, window=40), {"full": 30, "sliding": 30, "linear_state": 4})
    # history 100 is not a page boundary: no snapshot, so no hit for a state model
    prefilled(m, 1, PROMPT)
    assert m.create(2, PROMPT) == 0
    # history exactly 96 = 6 pages: commit stores a snapshot of request 3's state slot
    m.create(3, PROMPT[:96] + [1, 2])
    assert m.resize(3, 96, 96)
    m.take_events()
    assert m.commit(3, 96) == 96
    snap = [e for e in m.take_events() if e.group == "linear_state"]
    assert len(snap) == 1 and snap[0].num_tokens == 96
    assert snap[0].source_page == m.block_table(3, "linear_state")[0]
    # the hit takes the snapshot page as its own state slot, which drops its hash
    assert m.create(4, PROMPT) == 96
    assert_table(m, 4, "linear_state", [snap[0].page])
    assert [e.kind for e in m.take_events() if e.group == "linear_state"] == ["removed"]
    assert m.create(5, PROMPT) == 0  # the snapshot is gone
    m.check_integrity()


def test_without_state_snapshots_a_state_model_never_reuses() -> None:
    m = manager(hybrid_spec(tpb=16, window=40), {"full": 30, "sliding": 30, "linear_state": 4}, snapshots=False)
    m.create(1, PROMPT[:96] + [1, 2])
    assert m.resize(1, 96, 96) and m.commit(1, 96) == 96
    assert {e.group for e in m.take_events()} == {"full", "sliding"}  # no snapshot stored
    assert m.create(2, PROMPT) == 0


def test_a_refused_commit_appends_no_tokens() -> None:
    m = manager(full_spec(tpb=16), {"full": 20})
    m.create(1, PROMPT[:20])
    assert m.resize(1, 33, 32)
    with pytest.raises(CacheUsageError):
        m.commit(1, 33, tokens=PROMPT[20:33])  # beyond history 32
    assert m.commit(1, 32, tokens=PROMPT[20:32]) == 32  # the ids of the refused call were not kept
    assert m.create(2, PROMPT[:33]) == 32


def decoded(m: KVCacheManager, rid: int, prompt: list[int], out: list[int]) -> None:
    """`prefilled`, then `out` computed and committed at once."""
    prefilled(m, rid, prompt)
    n = len(prompt) + len(out)
    assert m.resize(rid, n + 1, n)
    m.commit(rid, n, out)


def stored_hashes(m: KVCacheManager) -> list[int]:
    return [e.block_hash for e in m.take_events() if e.kind == "stored"]


@pytest.mark.parametrize("twin", [False, True])
@pytest.mark.parametrize("ahead", [[7] * 40, [8] * 40, [7] * 20 + [8] * 20, [7] * 20 + [9] * 20])
def test_first_shared_fill_finds_a_twins_page_and_its_digests_are_those_commit_makes(
    ahead: list[int], twin: bool
) -> None:
    # a finished twin (prompt + 40 sevens) leaves its pages cached: a repeat asked about the ids it will
    # append finds its first decode page (positions 96..111, history 112) cached where they are sevens.
    # Whatever it was asked about, its commit (20 sevens, 20 nines) stores what a manager never asked stores.
    # (`twin`: a full and a sliding group, each pool looked up)
    spec, pages = (
        (twin_spec(tpb=16, window=40), {"full": 40, "sliding": 40}) if twin else (full_spec(tpb=16), {"full": 40})
    )
    asked, plain = (manager(spec, pages) for _ in range(2))
    for m in (asked, plain):
        decoded(m, 1, PROMPT, [7] * 40)
        m.free(1)
        prefilled(m, 2, PROMPT)
        stored_hashes(m)
    expected = 112 if ahead[:12] == [7] * 12 else None
    assert asked.first_shared_fill(2, ahead, 140) == expected
    for m in (asked, plain):
        assert m.resize(2, 141, 140)
        m.commit(2, 140, [7] * 20 + [9] * 20)
    assert stored_hashes(asked) == stored_hashes(plain) != []
    assert asked.first_shared_fill(2, [7], 141) is None  # no page fills
    asked.check_integrity()
