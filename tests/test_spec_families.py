"""Byte counts of every supported family, computed by hand from the config."""

from __future__ import annotations

import pytest

from conftest import attention_config
from kvpool import load_model_spec
from kvpool.errors import SpecError
from kvpool.presets import load_model_config, model_names
from kvpool.spec import LayerGroup, ModelSpec


def groups_by_name(spec: ModelSpec) -> dict[str, LayerGroup]:
    return {g.name: g for g in spec.groups}


def assert_group(
    g: LayerGroup,
    *,
    kind: str,
    layers: int,
    row_bytes: int = 0,
    state_bytes: int = 0,
    window: int | None = None,
    ratio: int | None = None,
) -> None:
    got = (g.kind, len(g.layers), g.row_bytes, g.state_bytes, g.window, g.ratio)
    want = (kind, layers, row_bytes, state_bytes, window, ratio)
    assert got == want, f"group {g.name}: (kind, layers, row, state, window, ratio) = {got}, want {want}"


def test_gqa_full_attention_qwen3_8b() -> None:
    spec = load_model_spec("qwen3-8b")
    (g,) = spec.groups
    # 36 layers x (K + V) x 8 kv heads x 128 head_dim x 2 bytes (bf16)
    assert_group(g, kind="full", layers=36, row_bytes=36 * 2 * 8 * 128 * 2)
    assert g.page_bytes == 32 * 36 * 2 * 8 * 128 * 2
    assert spec.full_attention_bytes_per_token == 147_456


def test_head_dim_falls_back_to_hidden_over_heads() -> None:
    spec = load_model_spec(attention_config())  # hidden 256 / 8 heads = 32
    assert spec.groups[0].row_bytes == 4 * 2 * 2 * 32 * 2


def test_mqa_and_mha() -> None:
    mqa = load_model_spec(attention_config(num_key_value_heads=1))
    mha = load_model_spec(attention_config(num_key_value_heads=None))
    assert mqa.groups[0].row_bytes == 4 * 2 * 1 * 32 * 2
    assert mha.groups[0].row_bytes == 4 * 2 * 8 * 32 * 2


@pytest.mark.parametrize(("tp", "heads_per_rank"), [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_tensor_parallel_splits_kv_heads(tp: int, heads_per_rank: int) -> None:
    # 8 / tp KV heads per rank, at least one (16 ranks replicate a head).
    spec = load_model_spec("qwen3-8b", tp_size=tp)
    assert spec.groups[0].row_bytes == 36 * 2 * heads_per_rank * 128 * 2


@pytest.mark.parametrize("tp", [3, 5, 24])
def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_refused(tp: int) -> None:
    # Qwen3-8B has 32 attention heads; vLLM's verify_with_parallel_config and
    # SGLang's attention layers refuse a TP that leaves a remainder.
    with pytest.raises(SpecError, match="tensor-parallel size .* does not divide the model's 32 attention heads"):
        load_model_spec("qwen3-8b", tp_size=tp)


@pytest.mark.parametrize(
    ("dtype", "row"),
    [
        ("bf16", 8 * 128 * 2),
        ("fp16", 8 * 128 * 2),
        ("fp32", 8 * 128 * 4),
        ("fp8", 8 * 128 * 1),
        # NVFP4: 1024 values -> 512 bytes of 4-bit data + 1024/16 = 64 FP8 scales
        ("nvfp4", 512 + 64),
        ("auto", 8 * 128 * 2),  # the config says bfloat16
        ("FP8", 8 * 128),
    ],
)
def test_kv_dtypes(dtype: str, row: int) -> None:
    spec = load_model_spec("llama-3.1-8b-instruct", kv_dtype=dtype)
    assert spec.groups[0].row_bytes == 32 * 2 * row


def test_auto_dtype_follows_config_float16() -> None:
    spec = load_model_spec(attention_config(torch_dtype="float16"))
    assert spec.kv_dtype == "fp16"


def test_gemma3_sliding_window_pattern_without_layer_types() -> None:
    cfg = attention_config(num_hidden_layers=12, sliding_window=64, sliding_window_pattern=6)
    g = groups_by_name(load_model_spec(cfg))
    # every 6th layer (5, 11) is global
    assert g["full"].layers == (5, 11)
    assert g["sliding"].layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert_group(g["sliding"], kind="sliding", layers=10, row_bytes=10 * 2 * 2 * 32 * 2, window=64)


def test_gemma4_heterogeneous_global_layers() -> None:
    g = groups_by_name(load_model_spec("gemma-4-26b-a4b"))
    # 25 sliding layers: 8 kv heads x 256; 5 global layers: 2 kv heads x 512, K and V both cached
    assert_group(g["sliding"], kind="sliding", layers=25, row_bytes=25 * 2 * 8 * 256 * 2, window=1024)
    assert_group(g["full"], kind="full", layers=5, row_bytes=5 * 2 * 2 * 512 * 2)
    assert g["sliding"].page_bytes == 32 * 204_800


def test_mistral_uniform_window_and_window_beyond_max_seq_len() -> None:
    spec = load_model_spec("mistral-7b-v0.1")
    assert_group(spec.groups[0], kind="sliding", layers=32, row_bytes=32 * 2 * 8 * 128 * 2, window=4096)
    # a window no request can outgrow is full attention
    full = load_model_spec("mistral-7b-v0.1", max_seq_len=4096)
    assert [g.kind for g in full.groups] == ["full"]


def test_use_sliding_window_false_means_full() -> None:
    cfg = attention_config(sliding_window=128, use_sliding_window=False)
    assert [g.kind for g in load_model_spec(cfg).groups] == ["full"]


def test_qwen2_style_max_window_layers() -> None:
    cfg = attention_config(sliding_window=128, use_sliding_window=True, max_window_layers=3)
    g = groups_by_name(load_model_spec(cfg))
    assert g["full"].layers == (0, 1, 2) and g["sliding"].layers == (3,)


def test_llama4_chunked_attention() -> None:
    g = groups_by_name(load_model_spec("llama-4-scout-17b-16e"))
    # 36 RoPE layers chunked(8192), 12 NoPE layers global; 8 kv heads x 128
    assert_group(g["chunked"], kind="chunked", layers=36, row_bytes=36 * 2 * 8 * 128 * 2, window=8192)
    assert_group(g["full"], kind="full", layers=12, row_bytes=12 * 2 * 8 * 128 * 2)


def test_llama4_default_nope_interval_without_layer_types() -> None:
    cfg = attention_config(num_hidden_layers=8, attention_chunk_size=256)
    g = groups_by_name(load_model_spec(cfg))
    assert g["full"].layers == (3, 7)
    assert g["chunked"].window == 256


def test_deepseek_v3_mla_not_split_by_tp() -> None:
    for tp in (1, 8):
        (g,) = load_model_spec("deepseek-v3", tp_size=tp).groups
        # one latent row of kv_lora_rank 512 + rope 64 values, bf16, 61 layers
        assert_group(g, kind="full", layers=61, row_bytes=61 * (512 + 64) * 2)


def test_deepseek_v32_indexer_keys() -> None:
    g = groups_by_name(load_model_spec("deepseek-v3.2-exp", kv_dtype="fp8"))
    assert_group(g["mla"], kind="full", layers=61, row_bytes=61 * 576)
    # FP8 128-dim key + one FP32 scale per 128 values, whatever the KV dtype
    assert_group(g["indexer"], kind="full", layers=61, row_bytes=61 * (128 + 4))


def test_deepseek_v4_compressed_attention() -> None:
    spec = load_model_spec("deepseek-v4-flash")
    assert spec.tokens_per_block == 128
    g = groups_by_name(spec)
    # compress_ratios: layers 0,1 -> 0; then 4,128 alternating for 40 layers; layer 42 -> 4
    n4, n128 = 21, 20
    assert_group(g["sliding"], kind="sliding", layers=43, row_bytes=43 * 512 * 2, window=128)
    assert_group(g["compressed4"], kind="compressed", layers=n4, row_bytes=n4 * 512 * 2, ratio=4)
    assert_group(g["indexer4"], kind="compressed", layers=n4, row_bytes=n4 * 132, ratio=4)
    assert_group(g["compressed128"], kind="compressed", layers=n128, row_bytes=n128 * 1024, ratio=128)
    # compressor state, fp32: ratio 4 keeps 2*4 positions of 2h + 2h + 2ih + 2ih values,
    # ratio 128 keeps 128 positions of h + h values
    per_r4 = 8 * 4 * (1024 + 1024 + 256 + 256)
    per_r128 = 128 * 4 * (512 + 512)
    assert_group(g["compressor_state"], kind="state", layers=n4 + n128, state_bytes=n4 * per_r4 + n128 * per_r128)
    # a 128-position page holds 32 rows of ratio 4 and 1 row of ratio 128
    assert g["compressed4"].page_bytes == 32 * n4 * 1024
    assert g["compressed128"].page_bytes == n128 * 1024


def test_deepseek_v4_fp8_and_nvfp4_rows() -> None:
    fp8 = groups_by_name(load_model_spec("deepseek-v4-flash", kv_dtype="fp8"))
    assert fp8["sliding"].row_bytes == 43 * 512
    nv = groups_by_name(load_model_spec("deepseek-v4-flash", kv_dtype="nvfp4"))
    assert nv["compressed4"].row_bytes == 21 * (256 + 32)


def test_qwen3_next_linear_state() -> None:
    g = groups_by_name(load_model_spec("qwen3-next-80b-a3b"))
    assert_group(g["full"], kind="full", layers=12, row_bytes=12 * 2 * 2 * 256 * 2)
    # recurrent 32 v-heads x 128 x 128, conv (2*16*128 + 32*128) channels x (4-1) steps, bf16
    per_layer = 32 * 128 * 128 * 2 + (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert_group(g["linear_state"], kind="state", layers=36, state_bytes=36 * per_layer)


def test_qwen3_next_tensor_parallel_and_top_level_fields() -> None:
    cfg = attention_config(
        num_hidden_layers=4,
        full_attention_interval=4,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
    )
    g = groups_by_name(load_model_spec(cfg, tp_size=4))
    per_layer = 8 * 128 * 128 * 2 + (2 * 4 * 128 + 8 * 128) * 3 * 2
    assert_group(g["linear_state"], kind="state", layers=3, state_bytes=3 * per_layer)
    assert g["full"].layers == (3,)


def test_text_config_is_followed() -> None:
    cfg = {"model_type": "gemma3", "text_config": attention_config(num_hidden_layers=2)}
    assert load_model_spec(cfg).num_layers == 2


def test_with_tokens_per_block_rescales_pages() -> None:
    spec = load_model_spec("qwen3-8b")
    assert spec.with_tokens_per_block(16).groups[0].page_bytes == 16 * 147_456


@pytest.mark.parametrize("name", model_names())
def test_every_preset_loads(name: str) -> None:
    spec = load_model_spec(name)
    assert spec.groups and all(g.slot_bytes > 0 for g in spec.groups)
    assert all(0 <= i < spec.num_layers for g in spec.groups for i in g.layers)


def test_gemma2_released_config_without_layer_types_alternates() -> None:
    # the config Google released has no layer_types; transformers alternates
    # (even layers sliding, odd layers global): 21 + 21 of the 42 layers
    cfg = {k: v for k, v in load_model_config("gemma-2-9b").items() if k != "layer_types"}
    for marker in ({"model_type": "gemma2"}, {}):  # the preset keeps cache_implementation=hybrid
        g = groups_by_name(load_model_spec({**cfg, **marker}))
        assert g["sliding"].layers == tuple(range(0, 42, 2)), marker
        assert g["full"].layers == tuple(range(1, 42, 2)), marker
