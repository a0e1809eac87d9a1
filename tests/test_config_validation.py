"""Config values no engine could load are refused by field and file; omitted
fields take the defaults transformers' config classes give them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import attention_config
from family_configs import falcon_h1_small, granite_small, jamba_v01, nemotron_small
from kvpool import SpecError, load_model_spec
from kvpool.spec.defaults import DEFAULTS, applied_defaults

DATA = Path(__file__).parent / "data" / "configs"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"num_key_value_heads": -2}, "num_key_value_heads"),
        ({"head_dim": 64.5}, "head_dim"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"num_key_value_heads": 16}, "num_key_value_heads"),  # more KV heads than query heads
        ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 3 does not divide 8
        ({"sliding_window": 100.5}, "sliding_window"),
        ({"sliding_window": 64, "sliding_window_pattern": 0}, "sliding_window_pattern"),
        ({"sliding_window": 64, "sliding_window_pattern": -2}, "sliding_window_pattern"),
        ({"text_config": 5}, "text_config"),
        ({"torch_dtype": 5}, "torch_dtype"),
        ({"model_type": "deepseek_v3"}, "kv_lora_rank"),
        ({"model_type": "qwen3_next"}, "linear_num_key_heads"),
        ({"layer_types": "full_attention"}, "layer_types"),
    ],
)
def test_invalid_value_names_field_and_file(tmp_path: Path, overrides: dict[str, Any], field: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(attention_config(**overrides)))
    with pytest.raises(SpecError) as e:
        load_model_spec(path)
    assert field in str(e.value) and str(path) in str(e.value)


def test_cli_exit_2_names_field_and_file(tmp_path: Path, cli: Any) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(attention_config(num_key_value_heads=0)))
    code, out, err = cli("inspect", str(path))
    assert code == 2 and "num_key_value_heads" in err and str(path) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_integral_float_is_accepted() -> None:
    assert load_model_spec(attention_config(head_dim=64.0)).groups[0].row_bytes == 4 * 2 * 2 * 64 * 2


def test_gemma3_27b_it_published_config_is_52_sliding_and_10_full() -> None:
    # No layer_types, no sliding_window_pattern: Gemma3TextConfig's default
    # makes layer i global when (i + 1) % 6 == 0 -> layers 5, 11, ..., 59.
    spec = load_model_spec(DATA / "gemma-3-27b-it.json")
    groups = {g.name: g for g in spec.groups}
    assert groups["full"].layers == tuple(range(5, 62, 6))
    assert len(groups["sliding"].layers) == 52 and groups["sliding"].window == 1024
    # 16 KV heads x 128 x bf16, K and V, per layer
    assert groups["sliding"].row_bytes == 52 * 2 * 16 * 128 * 2


def test_gemma3_4b_it_minimal_text_config_loads() -> None:
    # num_attention_heads 8, num_key_value_heads 4, head_dim 256 from Gemma3TextConfig.
    spec = load_model_spec(DATA / "gemma-3-4b-it.json")
    groups = {g.name: g for g in spec.groups}
    assert groups["full"].layers == (5, 11, 17, 23, 29)
    assert groups["sliding"].row_bytes == 29 * 2 * 4 * 256 * 2


def test_applied_defaults_name_their_source() -> None:
    config = json.loads((DATA / "gemma-3-4b-it.json").read_text())["text_config"]
    applied = applied_defaults(config)
    assert applied["num_attention_heads"][0] == 8
    assert applied["sliding_window_pattern"][0] == 6
    assert all("Gemma3TextConfig" in src for _v, src in applied.values())
    assert "sliding_window" not in applied  # the file sets it


@pytest.mark.parametrize("name", ["gemma-3-27b-it.json", "gemma-3-4b-it.json"])
def test_layers_agree_with_transformers(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    raw = json.loads((DATA / name).read_text())
    hf = transformers.AutoConfig.for_model(**raw).get_text_config()
    spec = load_model_spec(DATA / name)
    kind = {i: g.kind for g in spec.groups for i in g.layers}
    want = {"sliding_attention": "sliding", "full_attention": "full"}
    assert [kind[i] for i in range(hf.num_hidden_layers)] == [want[t] for t in hf.layer_types]
    sliding = next(g for g in spec.groups if g.kind == "sliding")
    assert sliding.window == hf.sliding_window
    per_layer = 2 * hf.num_key_value_heads * hf.head_dim * 2
    assert sliding.row_bytes == len(sliding.layers) * per_layer


@pytest.mark.parametrize("model_type", ["zamba2", "bamba", "mamba2"])
def test_unmodelled_hybrid_families_are_refused_by_name(model_type: str) -> None:
    with pytest.raises(SpecError, match=f"model_type '{model_type}'.*cannot model"):
        load_model_spec(attention_config(model_type=model_type))


@pytest.mark.parametrize("tp", [1, 2])
def test_jamba_attention_every_8th_layer_and_mamba_state(tp: int) -> None:
    spec = load_model_spec(jamba_v01(), tp_size=tp)
    groups = {g.name: g for g in spec.groups}
    assert groups["full"].layers == (4, 12, 20, 28)
    # K and V, 8 KV heads / tp x 128, bf16, 4 layers
    assert groups["full"].row_bytes == 4 * 2 * (8 // tp) * 128 * 2
    # 28 Mamba layers, d_inner = 2 x 4096 = 8192 split over tp; conv keeps 4 - 1 inputs,
    # SSM 16 states per channel; bf16
    per_layer = (8192 // tp) * (3 + 16) * 2
    assert groups["mamba_state"].kind == "state"
    assert groups["mamba_state"].state_bytes == 28 * per_layer


def test_jamba_layers_agree_with_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.JambaConfig(**jamba_v01())
    spec = load_model_spec(jamba_v01())
    kind = {i: g.kind for g in spec.groups for i in g.layers}
    want = {"attention": "full", "mamba": "state"}
    assert [kind[i] for i in range(32)] == [want[t] for t in hf.layers_block_type]


def test_jamba_defaults_fill_omitted_period() -> None:
    cfg = {k: v for k, v in jamba_v01().items() if k not in ("attn_layer_period", "attn_layer_offset")}
    assert {g.name: g for g in load_model_spec(cfg).groups}["full"].layers == (4, 12, 20, 28)


@pytest.mark.parametrize("tp", [1, 4])
def test_granite_hybrid_mamba2_state(tp: int) -> None:
    spec = load_model_spec(granite_small(), tp_size=tp)
    groups = {g.name: g for g in spec.groups}
    assert groups["full"].layers == (3, 7)
    assert groups["full"].row_bytes == 2 * 2 * -(-4 // tp) * (1536 // 12) * 2
    heads = 48 // tp
    conv = (heads * 64 + 2 * 1 * 128) * 3  # the one group is replicated on every rank
    ssm = heads * 64 * 128
    assert groups["mamba_state"].state_bytes == 6 * (conv + ssm) * 2


def test_granite_layers_agree_with_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.GraniteMoeHybridConfig(**granite_small())
    kind = {i: g.kind for g in load_model_spec(granite_small()).groups for i in g.layers}
    want = {"full_attention": "full", "linear_attention": "state"}
    assert [kind[i] for i in range(8)] == [want[t] for t in hf.layer_types]


@pytest.mark.parametrize("tp", [1, 2])
def test_nemotron_h_state_fp32_ssm(tp: int) -> None:
    groups = {g.name: g for g in load_model_spec(nemotron_small(), tp_size=tp).groups}
    assert groups["full"].layers == (3, 6)
    heads, ngroups = 32 // tp, 8 // tp
    conv = (heads * 64 + 2 * ngroups * 128) * 3 * 2  # bf16
    ssm = heads * 64 * 128 * 4  # mamba_ssm_cache_dtype defaults to float32
    assert groups["mamba_state"].layers == (0, 2, 5)
    assert groups["mamba_state"].state_bytes == 3 * (conv + ssm)


def test_nemotron_h_layers_agree_with_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.NemotronHConfig(**nemotron_small())
    kind = {i: g.kind for g in load_model_spec(nemotron_small()).groups for i in g.layers}
    want = {"full_attention": "full", "linear_attention": "state"}
    assert [kind.get(i) for i in range(7)] == [want.get(t) for t in hf.layers_block_type]


def test_falcon_h1_every_layer_has_kv_and_mamba2_state() -> None:
    cfg = falcon_h1_small()
    groups = {g.name: g for g in load_model_spec(cfg).groups}
    assert groups["full"].layers == groups["mamba_state"].layers == (0, 1, 2, 3)
    assert groups["full"].row_bytes == 4 * 2 * 2 * 64 * 2
    per_layer = ((24 * 64 + 2 * 128) * 3 + 24 * 64 * 128) * 2
    assert groups["mamba_state"].state_bytes == 4 * per_layer


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_recorded_defaults_are_transformers_own(model_type: str) -> None:
    """Each default kvpool applies to an omitted field is the value the
    transformers config class gives that field (a class attribute spelled with
    a leading underscore, like Gemma 3's `_sliding_window_pattern`, included)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type)
    for field, value in DEFAULTS[model_type][1].items():
        theirs = getattr(config, field, None)
        if theirs is None:
            theirs = getattr(config, f"_{field}")
        assert theirs == value, f"{model_type}.{field}: kvpool {value!r}, transformers {theirs!r}"


@pytest.mark.parametrize("tp", [1, 2])
def test_jamba_ssm_state_follows_the_ssm_cache_dtype(tp: int) -> None:
    """vLLM's --mamba-ssm-cache-dtype float32 keeps the SSM part (d_inner x d_state) in
    4 bytes, the conv part (d_inner x (d_conv - 1)) stays in the model's 2: vLLM's
    MambaStateDtypeCalculator.mamba1_state_dtype (the lane checks the pages it gives)."""
    auto = load_model_spec(jamba_v01(), tp_size=tp).group("mamba_state").state_bytes
    fp32 = load_model_spec(jamba_v01(), tp_size=tp, ssm_dtype="float32").group("mamba_state").state_bytes
    d_inner = 8192 // tp
    assert auto == 28 * d_inner * (3 + 16) * 2
    assert fp32 == 28 * (d_inner * 3 * 2 + d_inner * 16 * 4)
    with pytest.raises(SpecError, match="ssm_dtype"):
        load_model_spec(jamba_v01(), ssm_dtype="fp8")
