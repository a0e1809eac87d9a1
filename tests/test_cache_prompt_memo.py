"""The prompt memo (cache/prompt_memo.py): digests and prefix hits taken from
the previous prompt are exactly those computed from scratch, and a manager that
uses it is indistinguishable from one that does not, evictions included."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, manager, observed, twin_spec
from kvpool.cache import KVCacheManager, hashing
from kvpool.cache.checks import check_tokens
from kvpool.cache.hashing import Chain, extend_hashes, salt_seed
from kvpool.cache.pool import PagePool
from kvpool.cache.prompt_memo import KnownPages, PromptMemo

TPB = 4
BASES = [list(range(100, 140)), list(range(100, 120)) + list(range(700, 720)), list(range(300, 340))]

# a prompt: a base, cut at some length, then a tail of its own; and a salt
prompts = st.tuples(
    st.integers(0, 2), st.integers(0, 40), st.lists(st.integers(0, 9), max_size=9), st.sampled_from([None, "a"])
)


def prompt_of(base: int, cut: int, tail: list[int]) -> list[int]:
    return BASES[base][:cut] + tail


class ScratchMemo(PromptMemo):
    """A memo that remembers nothing: every digest from scratch, every page looked up."""

    def digests(
        self,
        ids: array[int],
        tokens_per_block: int,
        seed: int,
        num_blocks: int,
        pools: list[PagePool],
        chain: Chain | None = None,
    ) -> tuple[list[int], dict[int, KnownPages]]:
        out: list[int] = []
        extend_hashes(out, ids, tokens_per_block, seed, num_blocks, chain)
        return out, {}


def memo_and_scratch(sliding: bool, full_pages: int) -> tuple[KVCacheManager, KVCacheManager]:
    """Two managers of one spec and pages: one with the prompt memo, one without (`ScratchMemo`)."""
    spec = twin_spec(tpb=TPB, window=10) if sliding else full_spec(tpb=TPB)
    pages = {"full": full_pages, "sliding": 12} if sliding else {"full": full_pages}
    memo, scratch = manager(spec, pages), manager(spec, pages)
    scratch._prompts = ScratchMemo()
    return memo, scratch


def grow_both(pair: tuple[KVCacheManager, KVCacheManager], rid: int, n: int) -> None:
    """Grow `rid` by `n` positions in both managers (when it runs and fits): the same answer."""
    if rid in pair[0] and pair[0].capacity(rid) + n <= pair[0].max_capacity:
        grown = [bool(m.resize(rid, m.capacity(rid) + n)) for m in pair]
        assert grown[0] == grown[1]


def prefill_and_commit_both(pair: tuple[KVCacheManager, KVCacheManager], rid: int, length: int) -> None:
    """Prefill created `rid` to `length` in both managers and commit it where it fits: the same answers."""
    ok = [bool(m.resize(rid, length, length)) for m in pair]
    assert ok[0] == ok[1]
    if ok[0]:
        assert pair[0].commit(rid, length) == pair[1].commit(rid, length)


def assert_same_books(a: KVCacheManager, b: KVCacheManager) -> None:
    """The events so far and everything a caller can observe equal."""
    assert a.take_events() == b.take_events()
    assert observed(a) == observed(b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(prompts, st.integers(0, 12)), min_size=1, max_size=12))
def test_digests_are_those_from_scratch(calls: list[tuple[tuple[int, int, list[int], str | None], int]]) -> None:
    memo = PromptMemo()
    for (base, cut, tail, salt), blocks in calls:
        ids = check_tokens(prompt_of(base, cut, tail))
        blocks = min(blocks, len(ids) // TPB)
        want: list[int] = []
        extend_hashes(want, ids, TPB, salt_seed(salt), blocks)
        got, known = memo.digests(ids, TPB, salt_seed(salt), blocks, [])
        assert got == want and known == {}  # no hit remembered: no pages known
        ids.append(1)  # the memo holds no view of the caller's ids: they stay resizable


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from("aafg"), st.integers(0, 3), prompts, st.integers(1, 16)), max_size=40),
    sliding=st.booleans(),
    full_pages=st.integers(12, 30),
)
def test_a_manager_with_the_memo_is_one_without(
    ops: list[tuple[str, int, tuple[int, int, list[int], str | None], int]], sliding: bool, full_pages: int
) -> None:
    # admissions (free if running, create, prefill, commit), frees, and growth that evicts the
    # pages a freed prompt left cached, before the next admission that shares its prefix
    pair = memo, scratch = memo_and_scratch(sliding, full_pages)
    for kind, rid, (base, cut, tail, salt), n in ops:
        if kind == "g":
            grow_both(pair, rid, n)
        elif rid in memo:
            memo.free(rid)
            scratch.free(rid)
        if kind == "a":
            prompt = prompt_of(base, cut, tail) or [5]
            hits = [m.create(rid, prompt, salt=salt) for m in pair]
            assert hits[0] == hits[1]
            prefill_and_commit_both(pair, rid, len(prompt))
        assert_same_books(memo, scratch)
    assert memo.stats() == scratch.stats()
    memo.check_integrity()


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from("aacfg"), st.integers(0, 3), prompts, st.integers(1, 16)), max_size=40),
    sliding=st.booleans(),
    full_pages=st.integers(12, 30),
    frozen=st.booleans(),
)
def test_asking_then_creating_a_prompt_is_as_the_general_path(
    ops: list[tuple[str, int, tuple[int, int, list[int], str | None], int]],
    sliding: bool,
    full_pages: int,
    frozen: bool,
) -> None:
    # a scheduler's admission: the head asked (`can_create`, maybe `frozen`: its packed ids kept, not
    # copied), maybe again, then created with the ids it was handed back (the memo's early return, the
    # hit's pages known), against a manager that digests every prompt from scratch and looks every page up
    pair = fast, general = memo_and_scratch(sliding, full_pages)
    for kind, rid, (base, cut, tail, salt), n in ops:
        if kind == "g":
            grow_both(pair, rid, n)
        elif rid in fast:
            fast.free(rid)
            general.free(rid)
        if kind in "ac":
            prompt = check_tokens(prompt_of(base, cut, tail) or [5])
            checks = [fast.can_create(prompt, salt, n, frozen=frozen), general.can_create(prompt, salt, n)]
            assert checks[0] == checks[1]
            assert frozen or checks[0].ids is not prompt  # a copy unless frozen
            if kind == "c":  # another request grows (evicting cached pages), then it is asked again
                grow_both(pair, (rid + 1) % 4, 4 * n)
                checks = [m.can_create(c.ids, salt, n) for m, c in zip(pair, checks, strict=True)]
                assert checks[0] == checks[1]
            if checks[0]:
                hits = [m.create(rid, c.ids, salt) for m, c in zip(pair, checks, strict=True)]
                assert hits[0] == hits[1] == checks[0].hit
                prefill_and_commit_both(pair, rid, len(prompt))
        assert_same_books(fast, general)
    assert fast.stats() == general.stats()
    fast.check_integrity()


def test_a_prompt_asked_again_after_its_hit_was_evicted_is_looked_up_again() -> None:
    # the head's hit is remembered when it fits; before it is created another request grows over
    # those pages (evicting them); asked again with the ids handed back, the memo's early return
    # must not hand over the evicted pages
    spec, pages = full_spec(tpb=TPB), {"full": 12}
    fast, general = manager(spec, pages), manager(spec, pages)
    general._prompts = ScratchMemo()
    a = check_tokens(BASES[0])  # 40 tokens: 10 pages
    for m in (fast, general):
        m.create(2, [1, 2, 3])
        assert m.resize(2, 3, 3)
        m.create(0, a)
        assert m.resize(0, 40, 40)
        m.commit(0, 40)
        m.free(0)  # 10 pages cached
    checks = [m.can_create(a) for m in (fast, general)]
    assert checks[0] == checks[1] and checks[0].hit == 36  # fits: the hit's 9 pages remembered
    for m in (fast, general):
        assert m.resize(2, 44, 3)  # 11 pages: 9 of the 10 cached pages of `a` are evicted
    again = [m.can_create(c.ids) for m, c in zip((fast, general), checks, strict=True)]
    assert again[0] == again[1] and again[0].hit == TPB  # a free walks tables backwards: block 0 stays
    assert fast.create(3, again[0].ids) == general.create(3, again[1].ids) == TPB
    assert observed(fast) == observed(general)
    fast.check_integrity()


def test_a_shared_system_prompt_is_digested_once(monkeypatch: pytest.MonkeyPatch) -> None:
    m = manager(full_spec(tpb=16), {"full": 200})
    system = list(range(1000, 1000 + 16 * 40))
    calls: list[int] = []
    real = hashing.page_chain

    def counted(parent: int, data: bytes, width: int) -> list[int]:
        calls.append(len(data) // width)
        return real(parent, data, width)

    monkeypatch.setattr(hashing, "page_chain", counted)
    for rid in range(3):
        prompt = system + list(range(5000 + 100 * rid, 5000 + 100 * rid + 20))
        hit = m.create(rid, prompt)
        assert hit == (40 * 16 if rid else 0)
        assert m.resize(rid, len(prompt), len(prompt))
        m.commit(rid, len(prompt))
    # the first prompt digests its 41 whole pages; the next ones only the page past the system prompt
    assert calls[0] == 41 and all(c == 1 for c in calls[1:] if c)
    m.check_integrity()


def test_pages_evicted_since_the_last_hit_are_looked_up_again() -> None:
    # the last prompt's hit is remembered; its pages are freed and evicted (a running request grows
    # over them, no admission in between); the same prompt again must not be handed those pages
    spec, pages = full_spec(tpb=TPB), {"full": 12}
    memo, scratch = manager(spec, pages), manager(spec, pages)
    scratch._prompts = ScratchMemo()
    a = BASES[0]  # 40 tokens: 10 pages
    for m in (memo, scratch):
        m.create(2, [1, 2, 3])
        assert m.resize(2, 3, 3)
        m.create(0, a)
        assert m.resize(0, 40, 40)
        m.commit(0, 40)
        assert m.create(1, a) == 36  # the remembered hit: pages of blocks 0..8
        m.free(1)
        m.free(0)
        assert m.resize(2, 44, 3)  # 11 pages: 9 of the 10 cached pages of `a` are evicted
    # a free walks each table backwards, so the tail went first: block 0 is still cached
    assert memo.create(3, a) == scratch.create(3, a) == TPB
    assert observed(memo) == observed(scratch)
    memo.check_integrity()


def test_a_prompt_that_comes_back_is_not_digested_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted request admitted again after others: its pages' digests
    are the ones it had (the memo keeps recent prompts whole), none computed."""
    m = manager(full_spec(tpb=16), {"full": 400})
    calls: list[int] = []
    real = hashing.page_chain

    def counted(parent: int, data: bytes, width: int) -> list[int]:
        calls.append(len(data) // width)
        return real(parent, data, width)

    monkeypatch.setattr(hashing, "page_chain", counted)
    prompts = [list(range(1000 * (i + 1), 1000 * (i + 1) + 16 * 30 + 5)) for i in range(3)]
    for rid, prompt in enumerate(prompts):
        assert not m.can_create(prompt).hit
        m.create(rid, prompt)
    assert calls == [30, 30, 30]
    for rid, prompt in enumerate(prompts):  # they come back (preempted): asked, then created again
        m.free(rid)
        assert m.can_create(prompt).hit == 0  # (freed before they were computed: nothing cached)
        assert m.create(10 + rid, prompt) == 0
    assert calls == [30, 30, 30]
    scratch: list[int] = []
    extend_hashes(scratch, check_tokens(prompts[0]), 16, salt_seed(None), 30)
    assert m.requests.get(10).hashes == scratch


@pytest.mark.parametrize("events", [True, False])
def test_requests_of_one_prompt_asked_first_keep_their_own_ids(events: bool) -> None:
    """A scheduler asks about its packed prompt (`can_create`), then creates
    it: the ids checked when asked are taken as they are (`same_ids`), yet
    two requests of one prompt each append their own outputs (with events
    recorded a request keeps its ids whole), so each stores a page of its own."""
    m = manager(full_spec(tpb=TPB), {"full": 40}, events=events)
    prompt = check_tokens(list(range(100, 110)))  # 2 whole pages and 2 ids
    for rid in (0, 1):
        assert m.can_create(prompt).hit == 0
        assert m.create(rid, prompt) == 0
    for rid, out in ((0, [7, 7]), (1, [8, 8])):
        assert m.resize(rid, 12, 12)
        assert m.commit(rid, 12, out) == 12
    for out in ([7, 7], [8, 8]):
        assert m.cached_prefix([*range(100, 110), *out]).gpu == 12
    assert list(prompt) == list(range(100, 110))  # the caller's ids as they were
    m.check_integrity()


@pytest.mark.parametrize("events", [True, False])
def test_the_checked_ids_handed_back_are_the_prompt_and_stay_as_they_are(events: bool) -> None:
    """`can_create` hands back the ids it checked (`CreateCheck.ids`); passed
    to `create` (or asked again) they are taken as they are, yet every
    request still appends its outputs to ids of its own: the handed-back ids,
    and the hits, stay as with the caller's own ids."""
    spec = full_spec(tpb=TPB)
    handed, plain = manager(spec, {"full": 40}, events=events), manager(spec, {"full": 40}, events=events)
    prompt = list(range(100, 110))  # 2 whole pages and 2 ids
    for rid, out in ((0, [7, 7]), (1, [8, 8])):
        check = handed.can_create(prompt)
        assert check.ids is not None and list(check.ids) == prompt
        again = handed.can_create(check.ids)
        assert again.ids is check.ids and again == check == plain.can_create(prompt)
        assert handed.create(rid, check.ids) == plain.create(rid, prompt) == 8 * rid  # the second hits 2 pages
        for m in (handed, plain):
            assert m.resize(rid, 12, 12)
            assert m.commit(rid, 12, out) == 12
    assert check.ids is not None and list(check.ids) == prompt  # nobody appended to them
    assert observed(handed) == observed(plain) and handed.take_events() == plain.take_events()
    assert manager(spec, {"full": 40}, reuse=False).can_create(prompt).ids is None
    handed.check_integrity()


@pytest.mark.parametrize("events", [True, False])
def test_frozen_ids_are_kept_and_other_ids_are_copied(events: bool) -> None:
    """`can_create` keeps a copy of the ids it digests, so that a caller that
    writes its own array afterwards changes no later answer; with `frozen`
    (ids never written, only appended to) it keeps the caller's array itself,
    and the requests created from it still append their outputs to ids of
    their own."""
    spec = full_spec(tpb=TPB)
    m, plain = manager(spec, {"full": 40}, events=events), manager(spec, {"full": 40}, events=events)
    prompt = check_tokens(list(range(100, 110)))  # 2 whole pages and 2 ids
    for m_ in (m, plain):
        assert m_.create(0, prompt) == 0 and m_.resize(0, 10, 10)
        m_.commit(0, 10)  # 2 pages cached
    # (ids other than those the memo keeps each time: ids equal to them would be taken as they are)
    mine = check_tokens([*prompt, 60])
    check = m.can_create(mine)
    assert check.hit == 8 and check.ids is not None and check.ids is not mine  # a copy
    mine[0] = 1  # the caller's write: the kept copy is as it was
    assert m.can_create(check.ids).hit == 8 and list(check.ids) == [*prompt, 60]
    longer = [*prompt, 50]
    frozen = check_tokens(longer)
    check = m.can_create(frozen, frozen=True)
    assert check.hit == 8 and check.ids is frozen  # kept, not copied
    assert m.create(1, check.ids) == plain.create(1, longer) == 8
    for m_ in (m, plain):
        assert m_.resize(1, 12, 12) and m_.commit(1, 12, [7]) == 12
    assert list(frozen) == longer  # nobody appended to the caller's ids
    assert observed(m) == observed(plain) and m.take_events() == plain.take_events()
    m.check_integrity()


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 1200),
    differ=st.lists(st.integers(0, 1300), max_size=2),
    num_blocks=st.integers(0, 320),
    extra=st.integers(-5, 5),
)
@example(length=1200, differ=[132], num_blocks=320, extra=0)  # the first position of the second stretch
@example(length=1200, differ=[131], num_blocks=320, extra=0)  # the last of the first
@example(length=1200, differ=[644], num_blocks=320, extra=0)  # (TPB 4: stretches of 128, 512, ... ids from 4)
def test_common_pages_are_the_pages_before_the_first_difference(
    length: int, differ: list[int], num_blocks: int, extra: int
) -> None:
    # long prompts too: past the first stretches that `common_pages` compares (`GALLOP` pages, then more)
    old = check_tokens(list(range(length)))
    new = check_tokens([(-i if i in differ else i) % 50_000 + (7 if i in differ else 0) for i in range(length + extra)])
    memo = PromptMemo()
    remembered = (len(old) - 1) // TPB if old else 0
    memo.digests(old, TPB, salt_seed(None), remembered, [])
    asked = min(num_blocks, len(new) // TPB)
    n = min(asked, len(memo.hashes), len(old) // TPB)
    same = 0
    while same < n and new[same * TPB : (same + 1) * TPB] == old[same * TPB : (same + 1) * TPB]:
        same += 1
    assert memo.common_pages(new, TPB, asked) == same


def test_same_ids_are_only_the_remembered_int64_ids() -> None:
    memo = PromptMemo()
    ids = check_tokens(list(range(40)))
    memo.digests(ids, TPB, salt_seed(None), 10, [])
    assert memo.same_ids(ids[:]) is memo.ids
    assert memo.same_ids(list(range(40))) is None  # not packed: checked as any other
    assert memo.same_ids(array("i", range(40))) is None  # another type code
    assert memo.same_ids(ids[:-1]) is None and memo.same_ids(check_tokens([*range(39), 0])) is None
    assert PromptMemo().same_ids(array("q")) is None
    assert memo.same_ids(memo.ids) is memo.ids
    for at in (0, 17, 39):  # one id differs, anywhere
        other = ids[:]
        other[at] += 1
        assert memo.same_ids(other) is None


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from("aafg"), st.integers(0, 3), prompts, st.integers(1, 16)), max_size=30),
    asked=prompts,
    pages=st.integers(12, 30),
)
def test_a_short_hit_spares_the_pages_that_leave_it_as_short(
    ops: list[tuple[str, int, tuple[int, int, list[int], str | None], int]],
    asked: tuple[int, int, list[int], str | None],
    pages: int,
) -> None:
    """`CreateCheck.spare` of a prompt that does not fit is the walk its
    definition describes (free pages, then the LRU's oldest up to the first
    page of the hit but its last ones), and taking that many pages leaves the
    prompt exactly as short: checked against a plain walk of `lru_order`."""
    from kvpool.cache.prefix_hit import SPARE_WALK

    def built() -> KVCacheManager:  # admissions, frees and growth, as above
        m = manager(full_spec(tpb=TPB), {"full": pages})
        for kind, rid, (base, cut, tail, salt), n in ops:
            if kind == "g":
                if rid in m and m.capacity(rid) + n <= m.max_capacity:
                    m.resize(rid, m.capacity(rid) + n)
            elif rid in m:
                m.free(rid)
            if kind == "a":
                prompt = prompt_of(base, cut, tail) or [5]
                m.create(rid, prompt, salt=salt)
                if m.resize(rid, len(prompt), len(prompt)):
                    m.commit(rid, len(prompt))
        return m

    m = built()
    base, cut, tail, salt = asked
    prompt = prompt_of(base, cut, tail) or [5]
    check = m.can_create(prompt, salt, TPB)  # a page of positions after the hit
    if check:
        return
    pool = m.pools[0]
    hashes: list[int] = []
    extend_hashes(hashes, check_tokens(prompt), TPB, salt_seed(salt), check.hit // TPB)
    held = {pool.cached[h]: b for b, h in enumerate(hashes) if pool.ref[pool.cached[h]] == 0}
    walked, last = 0, len(hashes) - 1
    for page in pool.lru_order()[:SPARE_WALK]:
        block = held.get(page)
        if block is not None:
            if block != last:
                break
            last -= 1
        walked += 1
    spare = len(pool.free_stack) + walked
    assert check.spare == {"full": spare}
    after = built()  # the same pages, then `spare` of them taken
    after.create(999)
    assert after.resize(999, spare * TPB)  # takes `spare` pages: the free ones, then the LRU's oldest
    again = after.can_create(prompt, salt, TPB)
    assert dict(again.short) == dict(check.short)


def test_a_freed_prompt_asked_again_spares_its_whole_run_in_the_lru() -> None:
    # 8 pages: a prompt of 3 pages and a token computed and freed (3 pages cached, the last block
    # the oldest), the other 5 then held by another request; asked again with one position after
    # its hit, it is a page short, and taking its pages from the last block down leaves it as
    # short: all 3 are spare
    m = manager(full_spec(tpb=TPB), {"full": 8})
    prompt = list(range(100, 100 + 3 * TPB)) + [7]
    m.create(1, prompt)
    assert m.resize(1, len(prompt), len(prompt)) and m.commit(1, len(prompt)) == 3 * TPB
    m.create(2)
    assert m.resize(2, 4 * TPB)
    m.free(1)
    assert m.resize(2, 5 * TPB) and m.pools[0].num_free == m.pools[0].num_cached == 3
    check = m.can_create(prompt, None, 1)
    assert check.hit == 3 * TPB and dict(check.short) == {"full": 1} and dict(check.spare) == {"full": 3}
