"""Weight bytes per rank and under quantized storage, derived by hand from the
shapes; the header path and the config path agree on a checkpoint saved by
transformers; invariants of the tp / pp / ep / dp split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import KvpoolError
from kvpool.models.params import parameter_count
from kvpool.models.weight_dtype import matrix_bytes, weight_scheme
from kvpool.models.weights import ModelWeights, Parallel, model_weights, part_of, stage_layers, weights_from_config
from weights_helpers import tiny_config

CONFIGS = Path(__file__).parent / "data" / "configs"

# tiny llama (weights_helpers.TINY): V 96, H 32, I 48, 3 layers, 4 heads / 2 KV heads of 8, untied, bf16.
# per layer in bytes: q 2048, k 1024, v 1024, o 2048, MLP 9216, two norms 128; embed = lm_head = 6144; final norm 64
LAYER = 2048 + 1024 + 1024 + 2048 + 9216 + 128


def test_tiny_llama_bytes_by_hand() -> None:
    w = weights_from_config(tiny_config("llama"))
    assert w.total_bytes == 2 * 6144 + 3 * LAYER + 64 == 2 * parameter_count(tiny_config("llama"))
    # tp 2: everything halves but the norms
    assert w.per_rank_bytes(Parallel(tp=2)) == 3072 * 2 + 3 * (1024 + 512 + 512 + 1024 + 4608 + 128) + 64
    # tp 4: 2 KV heads over 4 ranks -> each rank keeps one head, half of k and v
    assert w.per_rank_bytes(Parallel(tp=4)) == 1536 * 2 + 3 * (512 + 512 + 512 + 512 + 2304 + 128) + 64
    # pp 2 of 3 layers: vLLM puts the extra layer before the last stage -> [2, 1]; embed first, lm_head last
    assert w.stage_bytes(Parallel(pp=2)) == [6144 + 2 * LAYER, LAYER + 6144 + 64]


def test_data_parallel_attention_replicates_attention_only() -> None:
    w = weights_from_config(tiny_config("llama"))
    attention = 2048 + 1024 + 1024 + 2048
    assert w.per_rank_bytes(Parallel(tp=2, dp=2)) == 3072 * 2 + 3 * (attention + 4608 + 128) + 64


@pytest.mark.parametrize(
    ("name", "part", "layer"),
    [
        ("model.embed_tokens.weight", "embed", None),
        ("lm_head.weight", "lm_head", None),
        ("model.norm.weight", "final_norm", None),
        ("model.layers.3.self_attn.k_proj.qweight", "kv", 3),  # AWQ packed weights follow their module
        ("model.layers.3.self_attn.kv_b_proj.weight", "attention", 3),
        ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight_scale_inv", "attention_replicated", 3),
        ("model.layers.5.mlp.experts.17.down_proj.weight", "experts", 5),
        ("model.layers.5.mlp.shared_experts.up_proj.weight", "mlp", 5),
        ("model.layers.5.mlp.gate.weight", "replicated", 5),
        ("model.layers.5.mlp.experts.gate_up_proj_blocks", "experts", 5),
        ("model.layers.61.mlp.experts.0.up_proj.weight", "unloaded", 61),  # DeepSeek-V3's MTP layer
        ("model.language_model.layers.2.mlp.down_proj.weight", "mlp", 2),
        ("model.vision_tower.encoder.layers.2.self_attn.q_proj.weight", "replicated", None),
    ],
)
def test_checkpoint_names_fall_into_their_parts(name: str, part: str, layer: int | None) -> None:
    assert part_of(name, 61) == (part, layer)


def test_pipeline_stages_follow_vllm() -> None:
    # vLLM get_pp_indices: 80 // 3 = 26 each, the 2 extra layers on the stages before the last
    assert [len(r) for r in stage_layers(80, 3)] == [27, 27, 26]
    assert [len(r) for r in stage_layers(61, 4)] == [15, 15, 16, 15]  # the example in vLLM's docs
    with pytest.raises(KvpoolError, match="more stages"):
        stage_layers(3, 4)


@pytest.mark.parametrize(
    ("par", "needle"), [({"tp": 4, "dp": 3}, "--dp 3"), ({"tp": 2, "ep": 4}, "--ep 4"), ({"tp": 0}, "--tp")]
)
def test_bad_layouts_are_refused(par: dict[str, int], needle: str) -> None:
    with pytest.raises(KvpoolError, match=needle):
        Parallel(**par)


def test_experts_split_over_ep_ranks() -> None:
    w4 = weights_from_config(tiny_config("mixtral"))  # 4 experts of gate/up/down 48 x 32, 3 layers
    # tp 4 splits every expert 4 ways; ep 4 gives each rank one whole expert: the same bytes
    assert w4.per_rank_bytes(Parallel(tp=4)) == w4.per_rank_bytes(Parallel(tp=4, ep=4))
    w3 = weights_from_config(tiny_config("mixtral") | {"num_local_experts": 3})
    expert = 3 * 48 * 32 * 2 * 3  # bytes of one expert over the 3 layers
    # ep 2 over 3 experts: the busiest rank holds 2 whole experts instead of half of all 3
    assert w3.per_rank_bytes(Parallel(tp=2, ep=2)) - w3.per_rank_bytes(Parallel(tp=2)) == 2 * expert - 3 * expert // 2


def test_fp8_block_nvfp4_and_awq_matrix_bytes_by_hand() -> None:
    fp8 = weight_scheme({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    assert matrix_bytes(fp8, 300, 200, convertible=True) == 60000 + 4 * 3 * 2
    assert matrix_bytes(fp8, 300, 200, convertible=False) == 2 * 60000
    awq = weight_scheme({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    # 4-bit values, then per group of 128 inputs and each of 256 outputs: a 2-byte scale and a 4-bit zero
    assert matrix_bytes(awq, 256, 512, convertible=True) == 256 * 512 // 2 + 4 * 256 * 2 + 4 * 256 // 2
    nvfp4 = weight_scheme({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    assert matrix_bytes(nvfp4, 64, 64, convertible=True) == 2048 + 256 + 8
    with pytest.raises(KvpoolError, match="cannot size"):
        weight_scheme({"quantization_config": {"quant_method": "bitsandbytes"}})


def test_gpt_oss_mxfp4_converts_the_experts_only() -> None:
    c = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    expert_values = 24 * 3 * 2880 * 2880 * 32  # gate_up (2 x 2880 x 2880) + down per expert, 32 experts, 24 layers
    want = 2 * (parameter_count(c) - expert_values) + expert_values // 2 + expert_values // 32
    assert weights_from_config(c).total_bytes == want


def test_per_tensor_fp8_keeps_the_ignored_lm_head_in_bf16() -> None:
    c = json.loads((CONFIGS / "Qwen3-32B-FP8-Static-PerTensor.json").read_text())
    h, v, layers = 5120, 151936, 64
    norms = layers * (2 * h + 2 * 128) + h
    linear = parameter_count(c) - 2 * v * h - norms
    assert weights_from_config(c).total_bytes == 2 * (2 * v * h + norms) + linear + 4 * 7 * layers


def test_headers_of_a_transformers_checkpoint_agree_with_the_config_count(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = tiny_config("llama") | {"torch_dtype": "bfloat16"}
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    from_headers = model_weights(config, tmp_path)
    assert from_headers.source.startswith("safetensors headers")
    from_config = weights_from_config(config)
    for par in (Parallel(), Parallel(tp=2), Parallel(tp=4), Parallel(pp=2), Parallel(tp=2, dp=2)):
        assert from_headers.stage_bytes(par) == from_config.stage_bytes(par)


FAMILIES = ("llama", "qwen3", "mixtral", "deepseek_v3", "gpt_oss", "qwen2_moe")


def replicated_bytes(w: ModelWeights) -> int:
    return sum(t.nbytes for t in w.tensors if t.part in ("replicated", "attention_replicated", "final_norm"))


@settings(max_examples=60, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    tp_log=st.integers(0, 3),
    pp=st.integers(1, 3),
    ep_log=st.integers(0, 3),
    dp_log=st.integers(0, 3),
)
def test_split_invariants(family: str, tp_log: int, pp: int, ep_log: int, dp_log: int) -> None:
    tp = 2**tp_log
    par = Parallel(tp=tp, pp=pp, ep=2 ** min(ep_log, tp_log), dp=2 ** min(dp_log, tp_log))
    w = weights_from_config(tiny_config(family))
    stages = w.stage_bytes(par)
    # every byte is somewhere, and what every rank replicates is counted once per rank
    assert tp * sum(stages) >= w.total_bytes + (tp - 1) * replicated_bytes(w)
    assert max(stages) == w.per_rank_bytes(par) <= w.total_bytes + sum(t.nbytes for t in w.tensors if t.part == "embed")
    assert w.per_rank_bytes(Parallel(pp=pp)) >= w.per_rank_bytes(Parallel(tp=tp, pp=pp))
    assert weights_from_config(tiny_config(family)).per_rank_bytes(Parallel()) == w.total_bytes
