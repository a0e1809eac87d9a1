"""YaRN RoPE (as Qwen and DeepSeek checkpoints configure it): the inverse
frequencies and the cos/sin scale equal transformers' own yarn computation for
several parameter sets, and a tiny Qwen3 with yarn (factor 4 over a 16-position
original context, prompts past it) generates transformers' greedy tokens."""

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
    tiny_spec,
)
from kvpool.torch_engine.arch import ArchConfig, EngineError
from kvpool.torch_engine.runner import Engine
from kvpool.torch_engine.weights import tiny_config, tiny_model

transformers = pytest.importorskip("transformers")

YARN = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 16}
CASES = [
    YARN,
    YARN | {"beta_fast": 16, "beta_slow": 2},
    YARN | {"attention_factor": 0.8},
    YARN | {"mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
]


@pytest.mark.parametrize("params", CASES)
def test_inv_freq_and_scale_equal_transformers(params: dict[str, object]) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = tiny_config("qwen3", rope_parameters=dict(params))
    hf_config = transformers.Qwen3Config(**{k: v for k, v in config.items() if k != "model_type"})
    want_inv, want_scale = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    rope = ArchConfig.from_hf(config).ropes[0]
    assert rope.kind == "yarn"
    torch.testing.assert_close(rope.inv_freq(config["head_dim"]), want_inv, rtol=0, atol=0)
    assert rope.attention_factor == pytest.approx(want_scale, rel=1e-12)


def test_yarn_without_original_context_is_refused() -> None:
    params = {k: v for k, v in YARN.items() if k != "original_max_position_embeddings"}
    with pytest.raises(EngineError, match="original_max_position_embeddings"):
        ArchConfig.from_hf(tiny_config("qwen3", rope_parameters=params))


def test_greedy_parity_past_the_original_context() -> None:
    model, hf, config = tiny_model("qwen3", rope_parameters=dict(YARN))
    ids = prompts()[3]  # 30 tokens: past the 16-position original context
    with torch.no_grad():
        assert_close_logits(model.dense_logits(ids), hf(torch.tensor([ids])).logits[0], "yarn dense")
    plan = manual_plan(tiny_spec(config), 200, max_batch_size=8, max_seq_len=64, max_num_tokens=16, max_draft_len=3)
    outputs = Engine(model, plan, speculate=3).generate(prompts(), MAX_NEW, eos_token_id=config["eos_token_id"])
    for i, (prompt, out) in enumerate(zip(prompts(), outputs, strict=True)):
        want = hf_greedy(hf, prompt, MAX_NEW, config["eos_token_id"])
        assert_same_tokens(out.output_ids, want, f"yarn request {i}")
