"""A new attention kind is one rule object: registered through `spec.kinds`
alone, it is planned, paged and simulated without any other change."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvpool.cache import KVCacheManager
from kvpool.plan import ServingLimits, plan_pools
from kvpool.presets import load_gpu
from kvpool.sim import StepTimeModel, simulate
from kvpool.sim.steptime import Weights
from kvpool.spec import RULES, KindRule, LayerGroup, ModelSpec, register_kind
from kvpool.spec.kinds import Life
from kvpool.trace import Trace


class LastTwoPages(KindRule):
    """A toy kind: a query sees the keys of its own page and the page before
    (local attention over page-aligned blocks), so pages before those go stale."""

    name = "last_two_pages"

    def stale_pages(self, g: Life, history: int) -> int:
        return max(0, history // g.tokens_per_block - 1)

    def first_visible(self, g: Life, position: Any) -> Any:
        return (position // g.tokens_per_block - 1) * g.tokens_per_block

    def decode_worst_case_pages(self, g: Life, headroom: int) -> int | None:
        # history q*tpb + r holds ceil((r + headroom)/tpb) + 1 pages, most at r = tpb - 1
        tpb = g.tokens_per_block
        return -(-(tpb - 1 + headroom) // tpb) + 1

    def need_period(self, g: Life) -> tuple[int, int, int]:
        tpb = g.tokens_per_block
        return tpb, 2 * tpb, 2 * tpb

    def keys_read(self, g: Life, history: Any) -> Any:
        return history % g.tokens_per_block + g.tokens_per_block

    def key_span(self, g: Life, queries: int) -> int | None:
        return 2 * g.tokens_per_block + queries - 1


@pytest.fixture
def spec() -> Iterator[ModelSpec]:
    register_kind(LastTwoPages())
    try:
        tpb = 8
        groups = (
            LayerGroup("full", "full", (0,), tpb, row_bytes=64),
            LayerGroup("local", "last_two_pages", (1,), tpb, row_bytes=64),
        )
        yield ModelSpec(
            "toy",
            "test",
            groups,
            tpb,
            "bf16",
            1,
            2,
            config={"num_attention_heads": 4, "head_dim": 16, "hidden_size": 64},
        )
    finally:
        RULES.pop("last_two_pages")


def test_the_manager_releases_by_the_new_rule(spec: ModelSpec) -> None:
    plan = plan_pools(
        spec, ServingLimits(max_batch_size=4, max_seq_len=256, max_num_tokens=64), kv_memory_bytes=64 * 8 * 200
    )
    assert plan.pages("local") > 0 and plan.pages("full") > 0
    m = KVCacheManager(plan)
    m.create(1)
    assert m.resize(1, 41, 40)  # history 40 = page 5: pages 4 and 5 live, 0..3 stale
    assert m.live_pages(1, "full") == 6 and m.live_pages(1, "local") == 2
    assert m.block_table(1, "local").tolist()[:4] == [-1] * 4
    m.check_integrity()
    # the capacity query is exact for the new kind too (brute force over token_num)
    m.free(1)
    answer = m.max_generation_length(1)
    fits = []
    for t in range(1, 257):
        if d := m.add_dummy_requests(1, t):
            fits.append(t)
            m.free(d.ids[0])
    assert answer == max(fits)


def test_plan_and_simulator_use_the_new_rule(spec: ModelSpec) -> None:
    limits = ServingLimits(max_batch_size=8, max_seq_len=512, max_num_tokens=128)
    plan = plan_pools(spec, limits, kv_memory_bytes=64 * 8 * 400)
    # the reference request (capacity 2049, history 2048) holds ceil(2049/8) = 257
    # full pages and, by the new rule, 257 - (2048 // 8 - 1) = 2 local ones
    assert plan.ratio["local"] == pytest.approx(2 / 259)
    rng = np.random.default_rng(0)
    trace = Trace("toy", rng.integers(20, 200, 40), rng.integers(5, 100, 40))
    weights = Weights(1e8, 1e8)
    result = simulate(plan, trace.with_rate(None, 0), StepTimeModel.build(spec, load_gpu("h100"), weights), check=True)
    assert result.finished == 40


@pytest.mark.parametrize("engine", ["vllm", "vllm@0.32", "sglang", "trtllm", "trtllm@v1"])
def test_engine_models_refuse_a_kind_they_do_not_declare(spec: ModelSpec, engine: str) -> None:
    """A kind added in spec/ is refused by each engine model by name (group and kind),
    never sized as another kind (vLLM's and TensorRT-LLM's as full, SGLang's dropped)."""
    from kvpool.engines import EngineNotModelledError, registry

    e = registry.entry(engine)
    assert "last_two_pages" not in e.kinds
    plan = plan_pools(spec, ServingLimits(max_seq_len=64, max_batch_size=4, max_num_tokens=64), kv_memory_bytes=1 << 20)
    with pytest.raises(EngineNotModelledError, match=r"local \(last_two_pages\)"):
        registry.engine_report(engine, plan)
    with pytest.raises(EngineNotModelledError, match=r"local \(last_two_pages\)"):
        registry.launch(engine, plan, "toy")
