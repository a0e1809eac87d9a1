"""The routers of `kvpool.fleet`: round-robin is balanced, least-load picks
the least loaded, every router is deterministic with ties to the lowest worker,
the kv router follows the workers' events (after its lag) with Dynamo's cost
(its documented example) or SGLang's rule, and the prefix router is SGLang's
cache-aware rule on its own approximate tree."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_helpers import TPB, Replica, serve_through
from kvpool.cache.prefix_hit import TierHit
from kvpool.fleet import (
    ROUTER_NAMES,
    KvCost,
    KvRouter,
    LeastLoad,
    PrefixRouter,
    RoundRobin,
    RouteRequest,
    RouterError,
    make_router,
    registry,
    router_names,
)

ops = st.lists(st.tuples(st.sampled_from(["route", "prefill", "finish"]), st.integers(0, 1000)), max_size=60)


def prompt_of(rng: random.Random, prefixes: list[list[int]]) -> list[int]:
    return rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(0, 9))]


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 9), steps=ops)
def test_round_robin_takes_workers_in_turn_whatever_finishes(workers: int, steps: list[tuple[str, int]]) -> None:
    r = RoundRobin(workers)
    routed: list[int] = []
    for op, n in steps:
        if op == "route":
            routed.append(r.route(RouteRequest(len(routed), [n])))
        elif routed and op == "finish" and (len(routed) - 1) in r.loads.inflight:
            r.finished(len(routed) - 1)
    assert routed == [i % workers for i in range(len(routed))]
    counts = [routed.count(w) for w in range(workers)]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 7), steps=ops)
def test_least_load_picks_the_fewest_in_flight_lowest_first(workers: int, steps: list[tuple[str, int]]) -> None:
    r = LeastLoad(workers)
    rng = random.Random(len(steps))
    rid = 0
    for op, _ in steps:
        if op == "route":
            before = list(r.loads.requests)
            w = r.route(RouteRequest(rid, [1, 2, 3]))
            assert before[w] == min(before) and before.index(min(before)) == w
            rid += 1
        elif r.loads.inflight:
            r.finished(rng.choice(sorted(r.loads.inflight)))  # type: ignore[type-var]
    assert sum(r.loads.requests) == len(r.loads.inflight)


@pytest.mark.parametrize("name", ROUTER_NAMES)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), workers=st.integers(1, 4))
def test_every_router_is_deterministic(name: str, seed: int, workers: int) -> None:
    def run() -> list[int]:
        rng = random.Random(seed)
        prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 30))] for _ in range(3)]
        prompts = [prompt_of(rng, prefixes) for _ in range(25)]
        router = make_router(
            name, workers, **({"block_size": TPB} if name not in ("round-robin", "least-load") else {})
        )
        return serve_through(router, [Replica() for _ in range(workers)], prompts)[0]

    assert run() == run()


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_with_nothing_known_every_router_starts_at_worker_0(name: str) -> None:
    assert make_router(name, 5).route(RouteRequest("a", list(range(64)))) == 0


@pytest.mark.parametrize("variant", ["dynamo", "sglang"])
@settings(max_examples=40, deadline=None)
@given(
    workers=st.integers(2, 6),
    holder=st.integers(0, 5),
    blocks=st.integers(1, 12),
    tail=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_kv_routes_a_prefix_only_one_worker_holds_to_it(
    variant: str, workers: int, holder: int, blocks: int, tail: int, seed: int
) -> None:
    holder %= workers
    rng = random.Random(seed)
    prefix = [rng.randrange(1000) for _ in range(blocks * TPB)]
    replicas = [Replica() for _ in range(workers)]
    router = KvRouter(workers, block_size=TPB, variant=variant)
    replicas[holder].serve(0, prefix)
    router.observe(holder, replicas[holder].events())
    prompt = prefix + [rng.randrange(1000) for _ in range(tail)]
    if variant == "sglang" and len(prefix) / len(prompt) <= router.rule.cache_threshold:
        return  # below SGLang's threshold its rule goes to the smallest cache instead (next test)
    assert router.route(RouteRequest(1, prompt)) == holder


def test_kv_sglang_below_its_threshold_goes_to_the_smallest_cache() -> None:
    replicas = [Replica(), Replica(), Replica()]
    router = KvRouter(3, block_size=TPB, variant="sglang")
    for w, n in ((0, 3), (1, 1), (2, 2)):  # worker 1 caches the least
        replicas[w].serve(w, list(range(1000 * w, 1000 * w + 4 * n)))
        router.observe(w, replicas[w].events())
    assert [router.index.gpu_blocks(w) for w in range(3)] == [3, 1, 2]
    prompt = list(range(0, 4)) + list(range(5000, 5040))  # 4 of 44 tokens held by worker 0: under 0.3
    assert router.route(RouteRequest("x", prompt)) == 1
    prompt = list(range(0, 12)) + list(range(6000, 6008))  # 12 of 20 on worker 0: over 0.3
    assert router.route(RouteRequest("y", prompt)) == 0


def test_kv_sees_events_only_after_its_lag() -> None:
    replicas = [Replica(), Replica()]
    router = KvRouter(2, block_size=TPB, event_lag_s=0.5)
    prefix = list(range(100, 132))
    replicas[1].serve(0, prefix)
    router.observe(1, replicas[1].events(), now=1.0)
    assert router.choose(RouteRequest("early", prefix), 1.49) == 0  # nothing applied yet: tie -> worker 0
    assert router.route(RouteRequest("early", prefix), now=1.49) == 0
    router.finished("early")
    assert router.route(RouteRequest("late", prefix), now=1.5) == 1


def test_dynamo_cost_reproduces_its_documented_example() -> None:
    # Dynamo's router design doc: workers with (prefill, decode) blocks (8, 10), (5, 5), (2, 9) cost 18, 10
    # and 11 at overlap_score_weight 1; worker 2 (index 1) is selected. A prompt of 10 blocks with 2, 5, 8
    # cached gives those prefill blocks.
    bs, cost = 16, KvCost()
    costs = [cost.cost(10 * bs, bs, 0, TierHit(c * bs, c * bs, c * bs), d) for c, d in ((2, 10), (5, 5), (8, 9))]
    assert costs == [18, 10, 11]
    assert KvCost(overlap_weight=0).cost(10 * bs, bs, 0, TierHit(0, 0, 0), 7) == 7  # weight 0: load only


def test_dynamo_credits_host_and_disk_hits_at_their_weights() -> None:
    bs, cost = 16, KvCost()
    # 4 blocks on the GPU, 2 more on the host, 4 more on disk: 4 + 0.75 x 2 + 0.25 x 4 = 6.5 blocks of credit
    assert cost.credit(TierHit(4 * bs, 6 * bs, 10 * bs), bs) == 6.5
    assert cost.cost(20 * bs, bs, 3 * bs, TierHit(4 * bs, 6 * bs, 10 * bs), 20) == 20 + 3 - 6.5 + 20


def test_kv_books_waiting_prefill_and_distinct_blocks() -> None:
    router = KvRouter(2, block_size=TPB)
    a = list(range(40))
    assert router.route(RouteRequest("a", a)) == 0
    assert router.loads.prefill_tokens == [40, 0] and router.loads.blocks_with(0, []) == 10
    # the same prompt again: worker 0's cost is 80/4 + 10 blocks, worker 1's 40/4 + 10: worker 1
    assert router.route(RouteRequest("b", a)) == 1
    router.prefilled("a")
    assert router.loads.prefill_tokens == [0, 40]
    router.finished("a")
    assert router.loads.requests == [0, 1] and router.loads.blocks_with(0, []) == 0


def test_kv_routing_reuses_more_than_round_robin_on_shared_prefixes() -> None:
    rng = random.Random(7)
    prefixes = [[rng.randrange(1000) for _ in range(32)] for _ in range(4)]
    prompts = [prompt_of(rng, prefixes) for _ in range(60)]
    reused = {}
    for name in ("round-robin", "kv", "kv:sglang", "prefix"):
        router = make_router(name, 4, **({} if name == "round-robin" else {"block_size": TPB}))
        reused[name] = serve_through(router, [Replica() for _ in range(4)], prompts)[1]
    assert reused["kv"] > reused["round-robin"]
    assert reused["kv:sglang"] > reused["round-robin"] and reused["prefix"] > reused["round-robin"]


def test_prefix_router_keeps_a_prompt_where_it_sent_it_and_balances_when_asked() -> None:
    r = PrefixRouter(3, block_size=TPB)
    a, b = list(range(40)), list(range(500, 540))
    assert r.route(RouteRequest(0, a)) == 0
    assert r.route(RouteRequest(1, a + [7, 8])) == 0  # 40 of 42 tokens matched
    assert r.route(RouteRequest(2, b)) == 1  # no match: the smallest tree (1 and 2 empty: the lowest)
    assert r.tree.matched(RouteRequest(3, a).block_keys(TPB)) == [40, 0, 0]
    # imbalance: loads 66 / 0 / 0 (over 64 apart and over 1.5x): the least loaded wins over the match
    for i in range(64):
        r.loads.add(0, f"x{i}")
    assert r.route(RouteRequest(4, a)) == 2


def test_prefix_router_evicts_least_recently_routed_blocks_on_schedule() -> None:
    r = PrefixRouter(1, block_size=TPB, max_tree_tokens=40, eviction_interval_s=10.0)
    old, new = list(range(40)), list(range(500, 540))
    r.route(RouteRequest(0, old), now=0.0)
    r.route(RouteRequest(1, new), now=1.0)
    assert r.tree.tokens(0) == 80  # over the limit, but the eviction thread has not woken
    r.route(RouteRequest(2, [9999]), now=10.0)
    assert r.tree.tokens(0) == 40
    assert r.tree.matched(RouteRequest(9, new).block_keys(TPB)) == [40]
    assert r.tree.matched(RouteRequest(9, old).block_keys(TPB)) == [0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: make_router("random", 2), "unknown router"),
        (lambda: make_router("prefix:sglang", 2), "no variants"),
        (lambda: make_router("kv:vllm", 2), "variant"),
        (lambda: make_router("kv", 2, overlap_weight=-1), "negative"),
        (lambda: make_router("round-robin", 2, block_size=4), "unexpected keyword"),
        (lambda: make_router("least-load", 0), "at least one worker"),
        (lambda: make_router("prefix", 2, cache_threshold=2.0), "fraction"),
        (lambda: make_router("kv", 2, event_lag_s=-1.0), "event_lag_s"),
        (lambda: make_router("kv", 2).observe(2, []), "not one of 0..1"),
        (lambda: make_router("kv", 2).finished("never"), "not in flight"),
    ],
)
def test_misuse_is_a_router_error_naming_what_was_wrong(call: object, message: str) -> None:
    with pytest.raises(RouterError, match=message):
        call()  # type: ignore[operator]


def test_routing_a_request_twice_is_refused() -> None:
    r = make_router("least-load", 2)
    r.route(RouteRequest("a", [1]))
    with pytest.raises(RouterError, match="already in flight"):
        r.route(RouteRequest("a", [1]))


def test_the_clis_router_names_are_the_registrys() -> None:
    """`router_names` spells out what the router classes of `fleet.registry` name."""
    from_classes = (*registry.ROUTERS, *(f"kv:{v}" for v in KvRouter.VARIANTS if v != KvRouter.VARIANTS[0]))
    assert from_classes == router_names.ROUTER_NAMES
    assert set(registry.ROUTERS) == {n.partition(":")[0] for n in router_names.ROUTER_NAMES}
