"""The library rows of the bad-input table (tests/test_bad_input.py): each
call must raise its typed kvpool error, and a manager it was made on must be
exactly as before."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cache_helpers import assert_unchanged, hybrid_spec, manager, snapshot
from kvpool import KVCacheManager, PoolPlan, ServingLimits, load_model_spec, plan_pools
from kvpool.cache import CacheUsageError, TierSpec
from kvpool.errors import KvpoolError, LimitsError, SpecError
from kvpool.units import parse_size


@dataclass(frozen=True)
class LibraryCase:
    name: str
    call: Callable[[KVCacheManager], Any]
    error: type[KvpoolError]
    word: str

    def check(self) -> None:
        m = busy_manager()
        before = snapshot(m)
        try:
            self.call(m)
        except self.error as e:
            assert self.word.lower() in str(e).lower(), f"{self.word!r} not in {e}"
        else:
            raise AssertionError(f"{self.name}: accepted")
        assert_unchanged(before, snapshot(m))
        assert m.num_requests == 1


def busy_manager() -> KVCacheManager:
    """One request 7 with a 100-token prompt fully resized and committed."""
    m = manager(hybrid_spec(), {g.name: 64 for g in hybrid_spec().groups}, max_seq_len=1024)
    m.create(7, list(range(100)))
    assert m.resize(7, 100, 100)
    m.commit(7, 100)
    return m


def _spec_call(**kwargs: Any) -> Callable[[KVCacheManager], Any]:
    return lambda _m: load_model_spec("gemma-3-27b", **kwargs)


def _from_pages(n: Any) -> Callable[[KVCacheManager], Any]:
    return lambda m: PoolPlan.from_pages(m.spec, {g.name: n for g in m.spec.groups}, m.limits)


def _tiered(**kwargs: Any) -> Callable[[KVCacheManager], Any]:
    return lambda m: KVCacheManager(m.plan, **kwargs)


LIBRARY_CASES = [
    LibraryCase("parse_size int past 1 EiB", lambda _m: parse_size(2**61), KvpoolError, "1 EiB"),
    LibraryCase("parse_size 0", lambda _m: parse_size(0), KvpoolError, "positive"),
    LibraryCase("rid str", lambda m: m.create("a"), CacheUsageError, "ints"),  # type: ignore[arg-type]
    LibraryCase("rid float", lambda m: m.create(1.5), CacheUsageError, "ints"),  # type: ignore[arg-type]
    LibraryCase("rid None", lambda m: m.create(None), CacheUsageError, "ints"),  # type: ignore[arg-type]
    LibraryCase("rid bool", lambda m: m.create(True), CacheUsageError, "ints"),
    LibraryCase("rid negative", lambda m: m.create(-3), CacheUsageError, "dummies"),
    LibraryCase("rid duplicate", lambda m: m.create(7), CacheUsageError, "exists"),
    LibraryCase("tokens str", lambda m: m.create(8, ["a", "b"]), CacheUsageError, "token ids"),  # type: ignore[list-item]
    LibraryCase("tokens float", lambda m: m.create(8, [1.5, 2.0]), CacheUsageError, "token ids"),  # type: ignore[list-item]
    LibraryCase("tokens 2**80", lambda m: m.create(8, [2**80, 1]), CacheUsageError, "token ids"),
    LibraryCase("tokens negative", lambda m: m.create(8, [-1, 2]), CacheUsageError, "negative"),
    LibraryCase("salt list", lambda m: m.create(8, [1, 2, 3], salt=[1]), CacheUsageError, "salt"),  # type: ignore[arg-type]
    LibraryCase("resize float", lambda m: m.resize(7, 160.9, 100), CacheUsageError, "integer"),  # type: ignore[arg-type]
    LibraryCase("resize history float", lambda m: m.resize(7, 160, 100.5), CacheUsageError, "integer"),  # type: ignore[arg-type]
    LibraryCase("resize past max_seq_len", lambda m: m.resize(7, 10**9, 100), CacheUsageError, "max_seq_len"),
    LibraryCase("can_resize past max_seq_len", lambda m: m.can_resize(7, 10**9), CacheUsageError, "max_seq_len"),
    LibraryCase("resize unknown id", lambda m: m.resize(99, 10), CacheUsageError, "unknown"),
    LibraryCase("extend float", lambda m: m.extend([7], 1.5), CacheUsageError, "integer"),  # type: ignore[arg-type]
    LibraryCase("extend negative", lambda m: m.extend([7], -1), CacheUsageError, "integer"),
    LibraryCase("extend past max_seq_len", lambda m: m.extend([7], 2000), CacheUsageError, "max_seq_len"),
    LibraryCase("resize_many lengths", lambda m: m.resize_many([7], [120, 130]), CacheUsageError, "requests"),
    LibraryCase("resize_many floats", lambda m: m.resize_many([7], [120.5]), CacheUsageError, "integers"),
    LibraryCase("commit float", lambda m: m.commit(7, 99.5), CacheUsageError, "integer"),  # type: ignore[arg-type]
    LibraryCase("commit tokens 2**80", lambda m: m.commit(7, 100, [2**80]), CacheUsageError, "token ids"),
    LibraryCase("load_model_spec(None)", lambda _m: load_model_spec(None), SpecError, "preset name"),  # type: ignore[arg-type]
    LibraryCase("tokens_per_block 0", _spec_call(tokens_per_block=0), SpecError, "tokens_per_block"),
    LibraryCase("tokens_per_block 1.5", _spec_call(tokens_per_block=1.5), SpecError, "tokens_per_block"),
    LibraryCase("tp_size 0", _spec_call(tp_size=0), SpecError, "tp_size"),
    LibraryCase("from_pages -10", _from_pages(-10), LimitsError, "positive"),
    LibraryCase("from_pages 0", _from_pages(0), LimitsError, "positive"),
    LibraryCase("from_pages 10.7", _from_pages(10.7), LimitsError, "positive"),
    LibraryCase(
        "from_pages unknown group",
        lambda m: PoolPlan.from_pages(m.spec, {**{g.name: 4 for g in m.spec.groups}, "x": 4}),
        SpecError,
        "'x'",
    ),
    LibraryCase("limits max_seq_len -1", lambda _m: ServingLimits(max_seq_len=-1), LimitsError, "max_seq_len"),
    LibraryCase("limits max_seq_len 1.5", lambda _m: ServingLimits(max_seq_len=1.5), LimitsError, "max_seq_len"),  # type: ignore[arg-type]
    # tiers and their arguments, checked at the call (each failed late and untyped, or silently)
    LibraryCase("tiers str", _tiered(tiers="CPU"), CacheUsageError, "list of TierSpec"),
    LibraryCase("tiers dict", _tiered(tiers={"CPU": 2**20}), CacheUsageError, "list of TierSpec"),
    LibraryCase("tiers [None]", _tiered(tiers=[None]), CacheUsageError, "list of TierSpec"),
    LibraryCase("tiers tuple of tuples", _tiered(tiers=(("CPU", 2**20),)), CacheUsageError, "list of TierSpec"),
    LibraryCase("TierSpec CPU 2**40", _tiered(tiers=[TierSpec("CPU", 2**40)]), CacheUsageError, "keeps books"),
    LibraryCase("TierSpec DISK 2**50", _tiered(tiers=[TierSpec("DISK", 2**50)]), CacheUsageError, "DISK tier"),
    LibraryCase("max_util_for_resume nan", _tiered(max_util_for_resume=float("nan")), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume inf", _tiered(max_util_for_resume=float("inf")), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume str", _tiered(max_util_for_resume="0.9"), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume None", _tiered(max_util_for_resume=None), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume -1", _tiered(max_util_for_resume=-1), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume 0", _tiered(max_util_for_resume=0), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume 1.5", _tiered(max_util_for_resume=1.5), CacheUsageError, "(0, 1]"),
    LibraryCase("max_util_for_resume True", _tiered(max_util_for_resume=True), CacheUsageError, "(0, 1]"),
    LibraryCase(
        "a pool of 2**30 pages",
        lambda m: KVCacheManager(PoolPlan.from_pages(m.spec, {g.name: 2**30 for g in m.spec.groups}, m.limits)),
        CacheUsageError,
        "keeps books",
    ),
    LibraryCase("parse_size 2**60 + 1 as text", lambda _m: parse_size(str(2**60 + 1)), KvpoolError, "1 EiB"),
    LibraryCase(
        "kv_memory_bytes nan",
        lambda m: plan_pools(m.spec, m.limits, kv_memory_bytes=float("nan")),  # type: ignore[arg-type]
        LimitsError,
        "kv_memory_bytes",
    ),
]
