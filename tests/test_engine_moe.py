"""Sparse MoE MLPs on the paged engine: Mixtral's (4 experts, top 2, weights
renormalised, a sliding window of 12) and Qwen3-MoE's (4 experts, top 2, not
renormalised: norm_topk_prob false, layer 1 of 3 dense through mlp_only_layers).
The routing equals transformers' router, dense logits match, and greedy tokens
equal transformers' with reuse, speculation and preemption."""

from __future__ import annotations

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
from kvpool.torch_engine.moe import SparseMoE
from kvpool.torch_engine.runner import Engine

pytest.importorskip("transformers")


MOE = ["mixtral", "qwen3_moe"]


@pytest.mark.parametrize("arch", MOE)
def test_routing_matches_transformers_and_uses_every_expert(arch: str) -> None:
    ours, hf, config = tiny(arch)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    moe = ours.model.layers[0].mlp
    assert isinstance(moe, SparseMoE)
    assert float(moe.experts.down_proj.detach().std()) > 0 < float(moe.experts.gate_up_proj.detach().std())
    weights, chosen = moe.route(x)
    _, want_w, want_idx = hf.model.layers[0].mlp.gate(x)
    torch.testing.assert_close(weights, want_w)
    assert torch.equal(chosen, want_idx)
    sums = weights.sum(-1)
    if config.get("norm_topk_prob", True):
        torch.testing.assert_close(sums, torch.ones(64))
    else:  # the top-2 of 4 softmax probabilities, kept as they are
        assert bool((sums < 1).all()) and bool((sums > 0.5).all())
    assert set(chosen.flatten().tolist()) == {0, 1, 2, 3}
    with torch.no_grad():
        torch.testing.assert_close(moe(x), hf.model.layers[0].mlp(x[None])[0], atol=1e-5, rtol=1e-5)


def test_qwen3_moe_keeps_the_dense_mlp_where_the_config_says() -> None:
    ours, hf, _ = tiny("qwen3_moe")
    kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
    assert kinds == ["SparseMoE", "MLP", "SparseMoE"]
    assert [type(layer.mlp).__name__ for layer in hf.model.layers] == [
        "Qwen3MoeSparseMoeBlock",
        "Qwen3MoeMLP",
        "Qwen3MoeSparseMoeBlock",
    ]


@pytest.mark.parametrize("arch", MOE)
def test_dense_logits_match(arch: str) -> None:
    ours, hf, _ = tiny(arch)
    ids = prompts()[3]
    with torch.no_grad():
        assert_close_logits(ours.dense_logits(ids), hf(torch.tensor([ids])).logits[0], f"{arch} dense")


@pytest.mark.parametrize(("arch", "pages", "speculate"), [(a, p, s) for a in MOE for p, s in [(200, 3), (30, 0)]])
def test_greedy_parity(arch: str, pages: int, speculate: int) -> None:
    model, hf, config = tiny(arch)
    plan = manual_plan(tiny_spec(config), pages, max_batch_size=8, max_seq_len=64, max_num_tokens=16, max_draft_len=3)
    engine = Engine(model, plan, speculate=speculate)
    outputs = engine.generate(prompts(), MAX_NEW, eos_token_id=config["eos_token_id"])
    for i, (prompt, out) in enumerate(zip(prompts(), outputs, strict=True)):
        want = hf_greedy(hf, prompt, MAX_NEW, config["eos_token_id"])
        assert_same_tokens(out.output_ids, want, f"{arch} request {i}")
    assert engine.kv_report()["reuse_hit_tokens"] > 0
    assert (engine.stats.preemptions > 0) == (pages == 30)
