"""Every way a spec can be refused: typed exceptions from the library, exit 2 from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import attention_config
from kvpool import SpecError, load_model_spec
from kvpool.errors import UnknownPresetError


def test_unknown_preset_suggests_closest() -> None:
    with pytest.raises(UnknownPresetError) as e:
        load_model_spec("qwen3-8")
    assert "qwen3-8b" in e.value.suggestions


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_model_spec(tmp_path / "nope.json")


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match=str(path)):
        load_model_spec(path)


def test_config_folder_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(attention_config()))
    assert load_model_spec(tmp_path).num_layers == 4


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("[1, 2]")
    with pytest.raises(SpecError, match="JSON object"):
        load_model_spec(path)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (attention_config(num_hidden_layers=None), "num_hidden_layers"),
        (attention_config(num_attention_heads=None, num_key_value_heads=None), "num_attention_heads"),
        (attention_config(layer_types=["sliding_attention"] * 4), "sliding_window"),
        (attention_config(layer_types=["chunked_attention"] * 4), "attention_chunk_size"),
        ({**attention_config(), "kv_lora_rank": 512}, "qk_rope_head_dim"),
        (
            {**attention_config(), "compress_ratios": [4, 4, 4, 4], "head_dim": 64, "sliding_window": 8},
            "index_head_dim",
        ),
        (attention_config(full_attention_interval=2, linear_num_key_heads=2), "linear_num_value_heads"),
    ],
)
def test_missing_field_is_named(config: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError, match=field):
        load_model_spec(config)


def test_unknown_layer_type() -> None:
    with pytest.raises(SpecError, match="cross_attention"):
        load_model_spec(attention_config(layer_types=["cross_attention"] * 4))


@pytest.mark.parametrize("dtype", ["int4", "fp6", ""])
def test_unsupported_dtype(dtype: str) -> None:
    with pytest.raises(SpecError, match="unsupported kv dtype"):
        load_model_spec("qwen3-8b", kv_dtype=dtype)


@pytest.mark.parametrize("tp", [0, -1, True])
def test_bad_tp(tp: int) -> None:
    with pytest.raises(SpecError, match="tp_size"):
        load_model_spec("qwen3-8b", tp_size=tp)


def test_compressed_ratio_must_divide_page() -> None:
    with pytest.raises(SpecError, match="not a multiple of compress ratio 128"):
        load_model_spec("deepseek-v4-flash", tokens_per_block=64)


def test_malformed_field_value() -> None:
    with pytest.raises(SpecError, match="malformed"):
        load_model_spec(attention_config(num_key_value_heads="many"))


def test_short_no_rope_layers_is_named() -> None:
    cfg = attention_config(attention_chunk_size=64, no_rope_layers=[1, 1])
    with pytest.raises(SpecError, match="no_rope_layers has 2 entries for 4 layers"):
        load_model_spec(cfg)
