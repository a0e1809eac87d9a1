"""llm-d's admission rule on every attention event kvpool emits.

llm-d's KV indexer (llm-d/llm-d-router PR #2363) admits a `BlockStored` only
for groups of kind `full_attention`, `mla_attention` or `sink_full_attention`
whose span is dense: `len(token_ids) % block_size == 0` and
`len(token_ids) / block_size == len(block_hashes)` (research notes,
routers-and-fleets.md 1.1). Sparse spans of other kinds poisoned its index
(DeepSeek-V4-Flash: prompt-token reuse 24.7 % before filtering, 75.9 % after).
Here the shared scheduler drives real traffic (prefill chunks, decode pages,
state snapshots, evictions to a host tier) on presets with sliding, chunked,
compressed and state groups: every event of an admitted kind passes, every
event of any kind is dense, and every other group is labelled with vLLM's
kind name, which llm-d and Dynamo skip."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvpool.cache import KVCacheManager, TierSpec
from kvpool.cache.kv_wire import SPEC_KIND, wire_events
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sched import Scheduler, Sequence
from kvpool.spec import load_model_spec

ADMITTED = {"full_attention", "mla_attention", "sink_full_attention"}  # llm-d-router PR #2363


def llmd_admits(event: dict[str, Any]) -> bool:
    """llm-d's rule for a decoded `BlockStored` (map form)."""
    tokens, bs, hashes = event["token_ids"], event["block_size"], event["block_hashes"]
    dense = bs > 0 and len(tokens) % bs == 0 and len(tokens) // bs == len(hashes)
    return event.get("kv_cache_spec_kind") in ADMITTED and dense


@pytest.mark.parametrize(
    ("preset", "tpb"),
    [
        ("gemma-4-26b-a4b", 16),  # sliding + full
        ("gpt-oss-20b", 16),  # sliding (with sinks) + full
        ("qwen3-next-80b-a3b", 16),  # a Mamba-style hybrid: full + linear (state) layers
        ("deepseek-v4-flash", 128),  # sliding, compressed, state
        ("llama-4-scout-17b-16e", 16),  # chunked + full
    ],
)
def test_every_attention_event_passes_llm_ds_admission_rule(preset: str, tpb: int) -> None:
    spec = load_model_spec(preset, tokens_per_block=tpb)
    limits = ServingLimits(max_batch_size=6, max_seq_len=16 * tpb, max_num_tokens=4 * tpb)
    plan = PoolPlan.from_pages(spec, {g.name: 40 for g in spec.groups}, limits)
    host = TierSpec(Medium.CPU, 30 * sum(g.slot_bytes for g in spec.groups))
    manager = KVCacheManager(plan, tiers=(host,), state_snapshots=True)
    scheduler = Scheduler(manager, limits)
    rng = random.Random(7)
    system = [rng.randrange(1, 30_000) for _ in range(3 * tpb)]
    events: list[dict[str, Any]] = []
    for rid in range(24):
        prompt = system + [rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 5 * tpb))]
        scheduler.add(Sequence(rid, prompt, rng.randrange(1, 3 * tpb)))
        for _ in range(4):
            step = scheduler.schedule()
            if step is None:
                break
            rows = [s for s, _ in step.decodes] + [s for s, a, n in step.prefills if a + n == s.num_tokens]
            scheduler.update(step, {s.rid: [rng.randrange(1, 30_000)] for s in rows})
            events += wire_events(manager.take_events(), manager.groups)
    stored = [e for e in events if e["type"] == "BlockStored"]
    kinds = {e["kv_cache_spec_kind"] for e in stored}
    assert kinds == {SPEC_KIND[g.kind] for g in spec.groups}, kinds  # every group stored something
    for e in stored:
        if e["kv_cache_spec_kind"] in ADMITTED:
            assert llmd_admits(e), e
        assert len(e["token_ids"]) == e["block_size"] * len(e["block_hashes"]), e  # dense, whatever the kind
    main = [g for g in spec.groups if SPEC_KIND[g.kind] in ADMITTED]
    assert {e["group_idx"] for e in stored if llmd_admits(e)} == {spec.groups.index(g) for g in main}
