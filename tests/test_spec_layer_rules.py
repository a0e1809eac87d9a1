"""The per-layer attention type (`spec.families.layer_types`) and the config
checks (`spec.validate.validate_config`) on the published config.json files of
tests/data/configs (SOURCES.md), with what each file says itself as the
expected answer:

- files that list `layer_types` and also carry the field an older rule reads
  (EXAONE 4's `sliding_window_pattern` letters, Qwen3.5's
  `full_attention_interval`): without the list, that rule rebuilds the file's
  own list;
- every file's types are one per layer, of the kinds kvpool plans, and a
  list shorter than the layers is refused;
- every file passes the checks, and one bad field of each kind the checks know
  makes a real file fail naming that field and the file, first in the order
  the checks run (the family, the counts, the heads, the dtypes, the fields a
  family needs, the layer list).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpool import SpecError
from kvpool.spec.families import layer_types
from kvpool.spec.validate import validate_config

CONFIGS = Path(__file__).parent / "data" / "configs"
FILES = sorted(CONFIGS.glob("*.json"))
KINDS = {"full_attention", "sliding_attention", "chunked_attention", "linear_attention", "attention"}


def text_config(path: Path) -> dict[str, Any]:
    """The decoder's config of a published file (a multimodal file's `text_config`)."""
    config: dict[str, Any] = json.loads(path.read_text())
    text = config.get("text_config")
    return dict(text) if isinstance(text, dict) and "num_hidden_layers" in text else config


def with_listed_types() -> list[tuple[str, str]]:
    """(file, the other field its list can be rebuilt from) of the files that list their layer types."""
    out = []
    for path in FILES:
        config = text_config(path)
        if config.get("layer_types"):
            for field in ("sliding_window_pattern", "full_attention_interval"):
                if config.get(field):
                    out.append((path.name, field))
    return out


def test_some_files_list_their_types_beside_an_older_rule() -> None:
    assert {field for _, field in with_listed_types()} == {"sliding_window_pattern", "full_attention_interval"}


@pytest.mark.parametrize(("name", "field"), with_listed_types())
def test_the_older_rule_rebuilds_the_files_own_layer_types(name: str, field: str) -> None:
    config = text_config(CONFIGS / name)
    listed = list(config.pop("layer_types"))
    assert field in config
    assert layer_types(config) == listed


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_file_has_one_planned_type_per_layer(path: Path) -> None:
    config = text_config(path)
    types = layer_types(config)
    assert len(types) == config["num_hidden_layers"]
    assert set(types) <= KINDS
    if config.get("layer_types"):
        shorter = dict(config, layer_types=config["layer_types"][:-1])
        with pytest.raises(SpecError, match="layer_types has"):
            layer_types(shorter)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_published_file_passes_the_checks(path: Path) -> None:
    config = json.loads(path.read_text())
    if config.get("model_type") in ("minimax_m3",):  # refused by name: kvpool does not model it
        with pytest.raises(SpecError, match="cannot model yet"):
            validate_config(config, path.name)
        return
    validate_config(config, path.name)
    validate_config(text_config(path), path.name)


QWEN3 = CONFIGS / "Qwen3-8B.json"
EXAONE = CONFIGS / "EXAONE-4.0-32B.json"


@pytest.mark.parametrize(
    ("path", "changes", "words"),
    [
        (QWEN3, {"model_type": "mamba2"}, ["Mamba-2", "cannot model yet"]),
        (QWEN3, {"num_key_value_heads": 0}, ["'num_key_value_heads' must be positive"]),
        (QWEN3, {"head_dim": 64.5}, ["'head_dim'", "must be an integer"]),
        (QWEN3, {"num_hidden_layers": 10_001}, ["'num_hidden_layers' is implausibly large"]),
        (QWEN3, {"max_window_layers": -1}, ["'max_window_layers' must be non-negative"]),
        (EXAONE, {"sliding_window_pattern": "LLXG"}, ["'sliding_window_pattern'", "string of L and G"]),
        (EXAONE, {"sliding_window_pattern": ""}, ["'sliding_window_pattern'", "string of L and G"]),
        (QWEN3, {"num_key_value_heads": 5}, ["'num_key_value_heads' (5) must divide num_attention_heads"]),
        (QWEN3, {"torch_dtype": 16}, ["'torch_dtype' must be a string"]),
        (QWEN3, {"dtype": "bfloat17"}, ["'dtype' is 'bfloat17', not a torch dtype"]),
        (QWEN3, {"model_type": "deepseek_v3"}, ["'deepseek_v3' needs field 'kv_lora_rank'"]),
        (QWEN3, {"layer_types": ["full_attention", 3]}, ["'layer_types' must be a list of strings"]),
        (QWEN3, {"layer_types": []}, ["'layer_types' has 0 entries"]),
        (QWEN3, {"layer_types": ["full_attention"] * 37}, ["'layer_types' has 37 entries for 36 layers"]),
        # two bad fields: the earlier check names its own
        (QWEN3, {"model_type": "rwkv", "num_key_value_heads": 0}, ["RWKV"]),
        (QWEN3, {"num_key_value_heads": 5, "torch_dtype": 16}, ["must divide"]),
        (QWEN3, {"torch_dtype": "nope", "model_type": "deepseek_v3"}, ["not a torch dtype"]),
        (QWEN3, {"model_type": "deepseek_v3", "layer_types": []}, ["kv_lora_rank"]),
    ],
)
def test_one_bad_field_in_a_published_file_is_named_with_the_file(
    path: Path, changes: dict[str, Any], words: list[str]
) -> None:
    config = {**json.loads(path.read_text()), **changes}
    with pytest.raises(SpecError) as e:
        validate_config(config, path.name)
    message = str(e.value)
    assert message.startswith(f"{path.name}: ")
    for word in words:
        assert word in message, message
