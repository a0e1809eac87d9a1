"""Hypothesis state machine over a full + sliding + state model: create (with
shared prefixes, so reuse hits happen), resize, batched decode, commit, free,
dummies and eviction under a tight pool. After every step `check_integrity`
holds; a refused call leaves every table and counter unchanged; the shapes the
manager reports are the ones the test asked for."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cache_helpers import assert_unchanged, hybrid_spec, manager, snapshot
from kvpool.cache import Dummies, KVCacheManager, Resize
from kvpool.cache.hashing import extend_hashes
from kvpool.spec import pages_needed

PREFIXES = [[7] * 40, list(range(40)), list(range(100, 140))]


class ManagerMachine(RuleBasedStateMachine):
    m: KVCacheManager

    def __init__(self) -> None:
        super().__init__()
        self.shapes: dict[int, tuple[int, int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.next_rid = 0
        self.turns: list[list[int]] = []  # committed token prefixes (conversations)

    @initialize(
        tpb=st.sampled_from([4, 8, 16]),
        window=st.integers(1, 40),
        pages=st.tuples(st.integers(8, 80), st.integers(4, 60), st.integers(2, 6)),
        reuse=st.sampled_from([True, True, True, False]),
    )
    def build(self, tpb: int, window: int, pages: tuple[int, int, int], reuse: bool) -> None:
        self.m = manager(
            hybrid_spec(tpb=tpb, window=window),
            {"full": pages[0], "sliding": pages[1], "linear_state": pages[2]},
            reuse=reuse,
            max_batch_size=2,
            num_extra_kv_tokens=1,
        )

    @property
    def rids(self) -> list[int]:
        return sorted(self.shapes)

    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        cut=st.sampled_from([8, 16, 32, 40]),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    )
    def create(self, prefix: int, cut: int, tail: list[int]) -> None:
        self.admit(PREFIXES[prefix][:cut] + tail)

    @precondition(lambda self: self.turns)
    @rule(data=st.data(), tail=st.lists(st.integers(0, 3), min_size=1, max_size=12))
    def follow_up(self, data: st.DataObject, tail: list[int]) -> None:
        """A next turn: a committed conversation's tokens plus new ones."""
        self.admit(data.draw(st.sampled_from(self.turns)) + tail)

    def admit(self, tokens: list[int]) -> None:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        hit = self.m.create(rid, tokens)
        tpb = self.m.tokens_per_block
        assert hit % tpb == 0 and 0 <= hit < len(tokens), (hit, len(tokens))
        if hit:  # the shared full-attention pages hold exactly this prefix's hashes
            want: list[int] = []
            extend_hashes(want, tokens, tpb, self.m.requests.get(rid).seed, hit // tpb)
            pool = self.m.pools[0]
            got = [pool.page_hash[p] for p in self.m.block_table(rid, "full").tolist()]
            assert got == want, (got, want)
        self.shapes[rid] = (hit, hit)
        self.tokens[rid] = tokens

    def refused_or_applied(self, call, expected: dict[int, tuple[int, int]]) -> None:  # type: ignore[no-untyped-def]
        before = snapshot(self.m)
        if call():
            self.shapes.update(expected)
        else:
            assert_unchanged(before, snapshot(self.m))

    @precondition(lambda self: self.shapes)
    @rule(data=st.data(), grow=st.integers(0, 40), advance=st.integers(0, 40))
    def resize(self, data: st.DataObject, grow: int, advance: int) -> None:
        rid = data.draw(st.sampled_from(self.rids))
        cap, hist = self.shapes[rid]
        new_hist = min(hist + advance, cap + grow)
        new_cap = max(new_hist, cap + grow - data.draw(st.integers(0, 20)))
        expected = self.m.can_resize(rid, new_cap, new_hist)
        ok: list[Resize] = []

        def resize() -> Resize:
            ok.append(self.m.resize(rid, new_cap, new_hist))
            return ok[0]

        self.refused_or_applied(resize, {rid: (new_cap, new_hist)})
        assert ok == [expected], f"can_resize said {expected}, resize did {ok}"

    @precondition(lambda self: self.shapes)
    @rule(data=st.data())
    def prefill_and_commit(self, data: st.DataObject) -> None:
        """Compute the prompt up to a page boundary and commit it (the only
        moment a state snapshot can be taken)."""
        rid = data.draw(st.sampled_from(self.rids))
        cap, hist = self.shapes[rid]
        tpb = self.m.tokens_per_block
        upto = len(self.tokens[rid]) // tpb * tpb
        if upto <= hist:
            return
        self.refused_or_applied(lambda: self.m.resize(rid, max(cap, upto), upto), {rid: (max(cap, upto), upto)})
        if self.shapes[rid][1] == upto:
            assert self.m.commit(rid, upto) == (upto if self.m.enable_reuse else 0)
            self.turns.append(self.tokens[rid][:upto])

    @precondition(lambda self: self.shapes)
    @rule(data=st.data(), steps=st.integers(1, 3))
    def decode(self, data: st.DataObject, steps: int) -> None:
        rids = data.draw(st.lists(st.sampled_from(self.rids), min_size=1, unique=True))
        expected = {r: (self.shapes[r][0] + steps, self.shapes[r][1] + steps) for r in rids}
        self.refused_or_applied(lambda: self.m.extend(rids, steps), expected)

    @precondition(lambda self: self.shapes)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.rids))
        hist = self.shapes[rid][1]
        known = self.tokens[rid]
        extra = [(rid + i) % 5 for i in range(max(0, hist - len(known)))]
        self.tokens[rid] = known + extra
        done = self.m.commit(rid, hist, tokens=extra)
        assert done == (hist // self.m.tokens_per_block * self.m.tokens_per_block if self.m.enable_reuse else 0)

    @precondition(lambda self: self.shapes)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.rids))
        self.m.free(rid)
        del self.shapes[rid]

    @rule(batch=st.integers(1, 3), token_num=st.integers(1, 80), draft=st.integers(0, 3), is_gen=st.booleans())
    def dummies(self, batch: int, token_num: int, draft: int, is_gen: bool) -> None:
        before = snapshot(self.m)
        dummies = self.m.add_dummy_requests(batch, token_num, draft, is_gen)
        if not dummies:
            assert dummies.short and not dummies.ids
            assert_unchanged(before, snapshot(self.m))
            return
        for rid in dummies.ids:
            self.m.free(rid)

    @rule(draft=st.integers(0, 3), batch=st.integers(1, 3))
    def query(self, draft: int, batch: int) -> None:
        answer = self.m.max_generation_length(batch, draft)
        if answer:
            shorts = self.m.add_dummy_requests(batch - 1, 1, draft) if batch > 1 else Dummies()
            assert shorts
            longest = self.m.add_dummy_requests(1, answer, draft)
            assert longest, f"max_generation_length {answer} does not allocate: {longest.short}"
            for rid in shorts.ids + longest.ids:
                self.m.free(rid)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "m"):
            return
        self.m.check_integrity()
        for rid, (cap, hist) in self.shapes.items():
            assert (self.m.capacity(rid), self.m.history(rid)) == (cap, hist)
            for g in self.m.groups:
                assert self.m.live_pages(rid, g.name) == pages_needed(g, cap, hist)
        for g in self.m.groups:
            s = self.m.stats().groups[g.name]
            assert s.free + s.used == s.total and s.cached <= s.free


ManagerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestManagerMachine = ManagerMachine.TestCase
