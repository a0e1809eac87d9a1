"""Families whose layers differ in heads, head size or kind, on their published
configs (tests/data/configs/), with the bytes written out by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvpool.errors import SpecError
from kvpool.spec import ModelSpec, load_model_spec

CONFIGS = Path(__file__).parent / "data" / "configs"


def published(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return config


def groups(spec: ModelSpec) -> dict[str, tuple[str, tuple[int, ...], int, int, int | None]]:
    return {g.name: (g.kind, g.layers, g.row_bytes, g.state_bytes, g.window) for g in spec.groups}


def test_mimo_v2_flash_sliding_layers_keep_twice_the_heads_and_a_narrower_v() -> None:
    """hybrid_layer_pattern: 0 (full) at layers 0, 5, 11, ..., 47; 1 (sliding) elsewhere.
    Full: 4 KV heads x (K 192 + V 128) x 2 bytes = 2560; sliding: 8 heads = 5120; the
    window is sliding_window_size 128 + the query = 129."""
    spec = load_model_spec(CONFIGS / "MiMo-V2-Flash.json", kv_dtype="bf16")
    full_layers = (0, 5, 11, 17, 23, 29, 35, 41, 47)
    sliding_layers = tuple(i for i in range(48) if i not in full_layers)
    assert groups(spec) == {
        "full": ("full", full_layers, 9 * 2560, 0, None),
        "sliding": ("sliding", sliding_layers, 39 * 5120, 0, 129),
    }
    tp4 = load_model_spec(CONFIGS / "MiMo-V2-Flash.json", kv_dtype="fp8", tp_size=4)
    assert tp4.group("full").row_bytes == 9 * 1 * 320  # 4 heads over 4 ranks, 1 byte each
    assert tp4.group("sliding").row_bytes == 39 * 2 * 320


def test_mimo_v2_flash_without_a_pattern_uses_the_class_default() -> None:
    config = published("MiMo-V2-Flash")
    del config["hybrid_layer_pattern"]
    spec = load_model_spec(config, kv_dtype="bf16")
    assert spec.group("full").layers == (0, 5, 11, 17, 23, 29, 35, 41, 47)


@pytest.mark.parametrize("pattern", [[0, 1, 2], "0,1", [True] * 48])
def test_mimo_v2_flash_bad_pattern_is_refused(pattern: object) -> None:
    config = published("MiMo-V2-Flash")
    config["hybrid_layer_pattern"] = pattern
    with pytest.raises(SpecError, match="hybrid_layer_pattern"):
        load_model_spec(config)


def test_nemotron_nas_reads_every_layer_block() -> None:
    """Llama-3.3-Nemotron-Super-49B: 49 attention blocks with n_heads_in_group 8
    (64 / 8 = 8 KV heads of 8192 / 64 = 128), 31 no-op blocks without attention:
    8 x (128 + 128) x 2 bytes = 4096 per attention layer."""
    config = published("Llama-3_3-Nemotron-Super-49B-v1")
    attention = [i for i, b in enumerate(config["block_configs"]) if not b["attention"]["no_op"]]
    assert len(attention) == 49
    spec = load_model_spec(config, kv_dtype="bf16")
    assert groups(spec) == {"full": ("full", tuple(attention), 49 * 4096, 0, None)}
    assert load_model_spec(config, kv_dtype="bf16", tp_size=8).group("full").row_bytes == 49 * 512


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"n_heads_in_group": 7}, "n_heads_in_group"),
        ({"n_heads_in_group": None}, "n_heads_in_group"),
        ({"window_length": 4096}, "window_length"),
    ],
)
def test_nemotron_nas_bad_block_is_refused_by_name(change: dict[str, Any], named: str) -> None:
    config = copy.deepcopy(published("Llama-3_3-Nemotron-Super-49B-v1"))
    config["block_configs"][0]["attention"].update(change)
    with pytest.raises(SpecError, match=f"block_configs\\[0\\].attention.{named}"):
        load_model_spec(config)


def test_kimi_linear_mla_layers_and_kda_state() -> None:
    """Kimi-K3 (text_config kimi_linear): full_attn_layers 4, 8, ..., 92, 93 (1-indexed)
    are MLA, one latent row of 512 + 64 values; the 69 KDA layers keep per request a
    96 x 128 x 128 recurrent matrix and 3 conv windows of 96 x 128 channels x 3 steps."""
    spec = load_model_spec(CONFIGS / "Kimi-K3.json", kv_dtype="bf16")
    full = tuple(i - 1 for i in [*range(4, 93, 4), 93])
    kda = tuple(i for i in range(93) if i not in full)
    state = (96 * 128 * 128 + 3 * 96 * 128 * 3) * 2
    assert groups(spec) == {
        "mla": ("full", full, 24 * (512 + 64) * 2, 0, None),
        "linear_state": ("state", kda, 0, 69 * state, None),
    }
    # heads split over tensor-parallel ranks; the MLA latent is not split
    tp8 = load_model_spec(CONFIGS / "Kimi-K3.json", kv_dtype="bf16", tp_size=8)
    assert tp8.group("linear_state").state_bytes == 69 * (12 * 128 * 128 + 3 * 12 * 128 * 3) * 2
    assert tp8.group("mla").row_bytes == 24 * 576 * 2


def test_kimi_linear_bad_layer_list_is_refused() -> None:
    config = copy.deepcopy(published("Kimi-K3"))
    config["text_config"]["linear_attn_config"]["kda_layers"].append(94)
    with pytest.raises(SpecError, match="kda_layers"):
        load_model_spec(config)


def test_minimax_m3_sparse_attention_is_refused_by_name() -> None:
    with pytest.raises(SpecError, match="minimax_m3.*cannot model"):
        load_model_spec(CONFIGS / "MiniMax-M3.json")


def test_exaone_letter_pattern_without_layer_types() -> None:
    """EXAONE 4 spells the pattern "LLLG" from layer 0; the last layer is global."""
    config = published("EXAONE-4.0-32B")
    del config["layer_types"]
    config["num_hidden_layers"] = 6
    spec = load_model_spec(config)
    assert spec.group("sliding").layers == (0, 1, 2, 4)
    assert spec.group("full").layers == (3, 5)
    with_types = load_model_spec(CONFIGS / "EXAONE-4.0-32B.json")
    assert with_types.group("full").layers == tuple(range(3, 64, 4))


@pytest.mark.parametrize("pattern", ["", "LLXG", "lllg"])
def test_exaone_bad_letter_pattern_names_the_field(pattern: str) -> None:
    config = published("EXAONE-4.0-32B")
    config["sliding_window_pattern"] = pattern
    with pytest.raises(SpecError, match="sliding_window_pattern"):
        load_model_spec(config)
