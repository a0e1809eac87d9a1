"""Engine parts: architecture reading, RoPE tables, weight loading, the n-gram
drafter, and paged attention vs dense attention over random chunkings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_helpers import assert_close_logits, manual_plan, tiny, tiny_spec
from kvpool.spec import stale_pages
from kvpool.torch_engine.arch import ArchConfig, EngineError, Rope
from kvpool.torch_engine.attention import PagedBatch, Row
from kvpool.torch_engine.drafter import NgramDrafter
from kvpool.torch_engine.kv_store import KVStore
from kvpool.torch_engine.names import ARCHS
from kvpool.torch_engine.weights import from_state_dict, load_folder, save_folder, tiny_config

# ------------------------------------------------------------------ drafter


def test_drafter_prefers_longest_latest_match() -> None:
    d = NgramDrafter(k=3)
    # Tail (7, 8, 9) occurred at index 1; what followed it: 4, 5, 6.
    assert d.propose([1, 7, 8, 9, 4, 5, 6, 2, 7, 8, 9]) == [4, 5, 6]
    # Only the 1-gram (3) matches; its latest earlier occurrence is at index 2.
    assert d.propose([3, 1, 3, 2, 3]) == [2, 3]
    assert d.propose([1, 2, 3]) == []  # no earlier occurrence of any tail
    assert d.propose([5, 5, 5, 5], limit=1) == [5]
    assert d.propose([5, 5], limit=0) == []


def test_drafter_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(k=0)


# ------------------------------------------------------------------ architecture


def test_arch_switches_and_windows() -> None:
    gemma = ArchConfig.from_hf(tiny_config("gemma3"))
    assert gemma.windows == (10, 10, 10, 10, 10, None)
    assert gemma.ropes[0].theta == 10_000.0 and gemma.ropes[5] == Rope(1_000_000.0, "linear", 2.0)
    assert gemma.attn_scale == 16**-0.5 and gemma.gemma and gemma.qk_norm
    mistral = ArchConfig.from_hf(tiny_config("mistral"))
    assert mistral.windows == (12, 12) and not mistral.qk_norm
    assert ArchConfig.from_hf(tiny_config("llama")).windows == (None, None)


def test_arch_reads_older_gemma3_config_fields() -> None:
    config = tiny_config("gemma3")
    del config["rope_parameters"]
    config |= {
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    cfg = ArchConfig.from_hf({"model_type": "gemma3", "text_config": config})
    assert cfg.ropes[0] == Rope(10_000.0) and cfg.ropes[5] == Rope(1_000_000.0, "linear", 8.0)


def test_arch_refuses_unknown_models() -> None:
    with pytest.raises(EngineError, match="not supported"):
        ArchConfig.from_hf({"model_type": "gpt2"})
    with pytest.raises(EngineError, match="RoPE type"):
        ArchConfig.from_hf(tiny_config("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}))
    with pytest.raises(EngineError, match="yarn RoPE without factor"):
        ArchConfig.from_hf(tiny_config("llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}))
    with pytest.raises(EngineError, match="missing or bad field"):
        ArchConfig.from_hf({"model_type": "llama"})


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rope_tables_equal_transformers(arch: str) -> None:
    model, hf, _ = tiny(arch)
    rotary = hf.model.rotary_emb
    for layer, rope in enumerate(model.cfg.ropes):
        name = "inv_freq" if arch == "llama" else f"{hf.config.layer_types[layer]}_inv_freq"
        torch.testing.assert_close(rope.inv_freq(16), getattr(rotary, name), rtol=0, atol=0)


# ------------------------------------------------------------------ weights


def test_folder_roundtrip_and_bad_checkpoints(tmp_path: Path) -> None:
    model, hf, config = tiny("mistral")
    folder = save_folder(hf, config, tmp_path / "m")
    loaded, cfg = load_folder(folder)
    assert cfg == config
    ids = list(range(5, 25))
    torch.testing.assert_close(loaded.dense_logits(ids), model.dense_logits(ids), rtol=0, atol=0)
    state = hf.state_dict()
    # A multimodal Gemma 3 checkpoint nests the decoder under language_model.
    g_model, g_hf, g_config = tiny("gemma3")
    nested = {k.replace("model.", "model.language_model.", 1): v for k, v in g_hf.state_dict().items()}
    torch.testing.assert_close(
        from_state_dict(g_config, nested).dense_logits(ids), g_model.dense_logits(ids), rtol=0, atol=0
    )
    with pytest.raises(EngineError, match="lacks 1 tensors"):
        from_state_dict(config, {k: v for k, v in state.items() if k != "model.norm.weight"})
    with pytest.raises(EngineError, match="does not fit"):
        from_state_dict(config | {"intermediate_size": 96}, state)
    with pytest.raises(EngineError, match="no \\*.safetensors"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text("{}")
        load_folder(tmp_path / "empty")


# ------------------------------------------------------------------ paged == dense


@settings(max_examples=50, deadline=None)
@given(
    arch=st.sampled_from(ARCHS),
    tpb=st.sampled_from([1, 2, 4, 8]),
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_paged_equals_dense_for_any_chunking(arch: str, tpb: int, chunks: list[int], seed: int) -> None:
    """Any page size, any chunking, scrambled page ids, stale pages marked as
    the manager marks them: the logits equal the dense run's."""
    model, _, config = tiny(arch)
    spec = tiny_spec(config, tokens_per_block=tpb)
    total = sum(chunks)
    pages = -(-total // tpb)
    plan = manual_plan(spec, pages + 3)
    store = KVStore(plan, model.cfg, torch.float32)
    rng = np.random.default_rng(seed)
    ids = torch.tensor(rng.integers(3, 256, total))
    tables = {g.name: rng.permutation(pages + 3)[:pages] for g in spec.groups}
    logits, start = [], 0
    with torch.no_grad():
        for n in chunks:
            live = {}
            for g in spec.groups:
                live[g.name] = tables[g.name].copy()
                live[g.name][: stale_pages(g, start)] = -1
            batch = PagedBatch([Row(start, n, live)], spec.groups, {g.name: pages + 3 for g in spec.groups})
            logits.append(
                model(
                    ids[start : start + n],
                    batch.positions,
                    lambda layer, q, k, v, b=batch: b.attend(
                        store.group_of_layer[layer],
                        store.layer(layer),
                        q,
                        k,
                        v,
                        model.cfg.attn_scale,
                        model.cfg.attn_logit_softcap,
                    ),
                )
            )
            start += n
    assert_close_logits(torch.cat(logits), model.dense_logits(ids), f"{arch} tpb {tpb} chunks {chunks}")


def test_qwen2_qkv_biases_load_and_match_transformers() -> None:
    # Qwen2 has q/k/v biases (no attention_bias field) and no o_proj bias; they
    # used to be dropped silently and the tokens differed from transformers.
    from kvpool.plan import PoolPlan, ServingLimits
    from kvpool.spec import load_model_spec
    from kvpool.torch_engine.runner import Engine
    from kvpool.torch_engine.weights import from_state_dict, hf_model, tiny_config

    config = tiny_config("mistral") | {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": None}
    hf = hf_model(config, seed=3)
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    model = from_state_dict(config, hf.state_dict())
    prompt = list(range(5, 14))
    ids = torch.tensor([prompt])
    want = hf.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12, pad_token_id=0, eos_token_id=None
    )[0, len(prompt) :].tolist()
    # the engine runs in float32 here; kv dtype auto would be bf16, what engines serve
    spec = load_model_spec(config, kv_dtype="fp32", tokens_per_block=4)
    plan = PoolPlan.from_pages(
        spec, {g.name: 40 for g in spec.groups}, ServingLimits(max_batch_size=4, max_seq_len=64, max_num_tokens=16)
    )
    got = Engine(model, plan).generate([prompt], 12)[0].output_ids
    assert got == want, (got, want)


def test_unknown_decoder_tensors_are_refused_not_dropped() -> None:
    from kvpool.torch_engine.arch import EngineError
    from kvpool.torch_engine.weights import from_state_dict, hf_model, tiny_config

    config = tiny_config("llama")
    state = dict(hf_model(config).state_dict())
    state["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    with pytest.raises(EngineError, match="does not implement"):
        from_state_dict(config, state)
