"""A speculative drafter's layers are their own groups of the target's spec
(spec/drafts.py): paged like the target's, planned into their own pools and
managed by the cache like any group; a spec whose groups disagree on tokens per
page is refused."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool import KVCacheManager, ServingLimits, load_model_spec, plan_pools
from kvpool.errors import SpecError
from kvpool.spec import LayerGroup, ModelSpec
from kvpool.spec.drafts import load_draft, method_of, mtp_draft, mtp_layer_count, with_draft


def test_a_draft_model_is_its_own_groups_after_the_target() -> None:
    target, draft = load_model_spec("qwen3-8b"), load_model_spec("qwen3-0.6b")
    spec = load_draft(target, "qwen3-0.6b")
    assert spec.target_groups == target.groups
    assert [g.name for g in spec.draft_groups] == [f"draft.{g.name}" for g in draft.groups]
    assert all(g.draft and g.row_bytes == d.row_bytes for g, d in zip(spec.draft_groups, draft.groups, strict=True))
    assert min(spec.draft_groups[0].layers) == target.num_layers  # registered after the target's
    assert spec.drafter is not None and (spec.drafter.method, spec.drafter.num_layers) == ("draft_model", 28)


def test_mtp_layers_repeat_the_targets_full_layer() -> None:
    spec = load_model_spec("deepseek-v3", tp_size=8)
    n = mtp_layer_count(spec.config)
    assert n == 1
    drafted = mtp_draft(spec)
    (mtp,) = drafted.draft_groups
    full = next(g for g in spec.groups if g.kind == "full")
    assert mtp.row_bytes == full.row_bytes // len(full.layers) and mtp.kind == "full"
    assert drafted.drafter is not None and drafted.drafter.method == "mtp"
    with pytest.raises(SpecError, match="no MTP layers"):
        mtp_draft(load_model_spec("qwen3-8b"))


def test_the_method_follows_the_draft_config() -> None:
    assert method_of({"architectures": ["LlamaForCausalLMEagle3"]}) == "eagle3"
    assert method_of({"architectures": ["EagleLlamaForCausalLM"]}) == "eagle"
    assert method_of({"architectures": ["Qwen3ForCausalLM"]}) == "draft_model"


def test_a_drafter_must_share_the_cache_config() -> None:
    target = load_model_spec("qwen3-8b")
    with pytest.raises(SpecError, match="tokens per page"):
        with_draft(target, load_model_spec("qwen3-0.6b", tokens_per_block=16), "draft_model")
    with pytest.raises(SpecError, match="draft method"):
        with_draft(target, load_model_spec("qwen3-0.6b"), "medusa")
    once = with_draft(target, load_model_spec("qwen3-0.6b"), "draft_model")
    with pytest.raises(SpecError, match="already has a drafter"):
        with_draft(once, load_model_spec("qwen3-0.6b"), "draft_model")


def test_groups_that_disagree_on_tokens_per_page_are_refused() -> None:
    """Prefix reuse hashes one page of positions for every group: a spec whose groups
    page differently is refused with SpecError, not left to crash reuse later."""
    groups = (LayerGroup("full", "full", (0,), 16, row_bytes=64), LayerGroup("other", "full", (1,), 32, row_bytes=64))
    with pytest.raises(SpecError, match=r"other \(32\).*16 tokens per page"):
        ModelSpec("mixed", "attention", groups, 16, "bf16", 1, 2)


@settings(max_examples=25, deadline=None)
@given(draft_len=st.integers(0, 4), memory=st.integers(64, 512), prompt=st.integers(1, 3000))
def test_draft_pools_are_planned_and_managed_like_any_group(draft_len: int, memory: int, prompt: int) -> None:
    """The plan gives the drafter's groups their own pools within the budget, and the
    manager allocates a request's pages in every group, drafter's included."""
    spec = load_draft(load_model_spec("llama-3.1-8b-instruct"), "qwen3-0.6b")
    limits = ServingLimits(max_seq_len=4096, max_batch_size=8, max_draft_len=draft_len)
    plan = plan_pools(spec, limits, kv_memory_bytes=memory << 20)
    assert {g.name for g in plan.groups} == set(spec.group_names)
    assert sum(g.bytes for g in plan.groups) <= plan.budget_bytes
    manager = KVCacheManager(plan)
    manager.create(1)
    got = manager.resize(1, prompt + 1 + draft_len, prompt)
    need = -(-(prompt + 1 + draft_len) // spec.tokens_per_block)
    fits = all(need <= g.pages for g in plan.groups)
    assert bool(got) == fits
    if got:  # the drafter's pages beside the target's, same page arithmetic
        assert manager.live_pages(1, "draft.full") == manager.live_pages(1, "full") == need


def test_a_draft_spec_is_replaceable_but_keeps_its_flags() -> None:
    spec = load_draft(load_model_spec("qwen3-8b"), "qwen3-0.6b")
    again = spec.with_tokens_per_block(16)
    assert [g.draft for g in again.groups] == [g.draft for g in spec.groups]
    assert dataclasses.replace(spec).drafter == spec.drafter


def test_the_engines_own_splits_simulate_with_a_drafter(cli: Any) -> None:
    """Each engine's split of a model with a drafter runs in the simulator; vLLM holds the
    drafter's layers in the target's KV-cache groups (one shared pool), the others give
    them pools of their own."""
    code, out, err = cli(
        "simulate", "qwen3-8b", "--draft-model", "qwen3-0.6b", "--draft-len", "3", "--gpu", "h100",
        "--kv-memory", "8GiB", "--max-seq-len", "8192", "--trace", "azure-conv", "--max-requests", "20",
        "--rate", "inf", "--compare", "engine:vllm,engine:sglang,engine:trtllm", "--json",
    )  # fmt: skip
    assert code == 0, err
    runs = {r["policy"]: r for r in json.loads(out)["runs"]}
    assert set(runs) == {"engine:vllm", "engine:sglang", "engine:trtllm"}
    assert all(r["finished"] == r["num_requests"] == 20 for r in runs.values())
    assert "draft.full" not in runs["engine:vllm"]["pages"] and "draft.full" in runs["engine:sglang"]["pages"]
