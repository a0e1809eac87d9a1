"""Gemma 2 on the paged engine: (1 + w) norms, sandwich norms, alternating
sliding (10) / full layers, and both softcaps (attention logits 2.0, final
logits 3.0, small enough to change a random model's tokens). Greedy tokens
must equal transformers' Gemma2ForCausalLM, with reuse, chunked prefill,
speculation and preemption; the dense logits must match and must differ from
the same model run without softcapping (so the caps are really exercised)."""

# mypy: disable-error-code="no-untyped-call,no-any-return"
# (transformers and tokenizers are untyped: these call them and return what they give)
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine_helpers import (
    MAX_NEW,
    assert_close_logits,
    assert_same_tokens,
    hf_greedy,
    manual_plan,
    prompts,
    tiny,
    tiny_spec,
)
from kvpool.torch_engine.model import DecoderLM
from kvpool.torch_engine.runner import Engine

pytest.importorskip("transformers")


def gemma2_greedy(prompt: list[int]) -> list[int]:
    _, hf, config = tiny("gemma2")
    return hf_greedy(hf, prompt, MAX_NEW, config["eos_token_id"])


def test_dense_logits_match_and_the_caps_matter() -> None:
    ours, hf, _ = tiny("gemma2")
    ids = prompts()[3]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    got = ours.dense_logits(ids)
    assert_close_logits(got, want, "gemma2 dense")
    assert float(got.abs().max()) <= 3.0  # the final cap bounds every logit
    uncapped = DecoderLM(dataclasses.replace(ours.cfg, attn_logit_softcap=None, final_logit_softcap=None))
    uncapped.load_state_dict(ours.state_dict())
    assert float((uncapped.dense_logits(ids) - got).abs().max()) > 0.1


@pytest.mark.parametrize(("pages", "speculate"), [(200, 0), (200, 3), (30, 3)])
def test_greedy_parity(pages: int, speculate: int) -> None:
    model, _, config = tiny("gemma2")
    plan = manual_plan(tiny_spec(config), pages, max_batch_size=8, max_seq_len=64, max_num_tokens=16, max_draft_len=3)
    engine = Engine(model, plan, speculate=speculate)
    outputs = engine.generate(prompts(), MAX_NEW, eos_token_id=config["eos_token_id"])
    for i, (prompt, out) in enumerate(zip(prompts(), outputs, strict=True)):
        assert_same_tokens(out.output_ids, gemma2_greedy(prompt), f"gemma2 request {i}")
    assert engine.kv_report()["reuse_hit_tokens"] > 0
    assert (engine.stats.preemptions > 0) == (pages == 30)
    assert {g.name for g in engine.spec.groups} == {"sliding", "full"}
