"""Every published config.json in tests/data/configs/ is read by kvpool as
transformers reads it: per layer the same attention kind, window, KV heads x
head sizes (as bytes per stored row) and recurrent-state layers, and the same
layer count. The table docs/models-corpus.md is generated from the same
comparison and must be current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from corpus_layers import (  # noqa: E402
    EXCEPTIONS,
    TABLE,
    Row,
    compare,
    corpus_files,
    hf_layers,
    kvpool_layers,
    render,
    summary,
)

FILES = corpus_files()
# published configs of families kvpool refuses by name (tests/test_spec_layerwise.py)
REFUSED = {"MiniMax-M3"}


def test_the_corpus_holds_at_least_25_published_configs_each_with_its_source() -> None:
    assert len(FILES) >= 25
    sources = (FILES[0].parent / "SOURCES.md").read_text()
    missing = [p.name for p in FILES if f"| {p.name} |" not in sources]
    assert not missing, f"no SOURCES.md row for {missing}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_kvpool_reads_each_layer_as_transformers_does(path: Path) -> None:
    row = compare(path)
    if row.refused is not None:
        # a family kvpool cannot model is refused by name, never planned as plain attention
        assert path.stem in REFUSED and f"model_type {row.model_type!r}" in row.refused, row.refused
        return
    if row.hf is None:
        pytest.skip(f"{row.verdict} (this transformers does not know it)")
    assert len(row.kvpool) == len(row.hf), "layer count"
    if path.stem in EXCEPTIONS:
        assert row.differing_layers, f"{path.stem} is listed as an exception but agrees: drop it from EXCEPTIONS"
        return
    diffs = {i: (row.kvpool[i], row.hf[i]) for i in row.differing_layers[:5]}
    assert not diffs, f"layer: (kvpool, transformers) {diffs}"


def test_gemma_3_27b_published_config_is_52_sliding_and_10_full() -> None:
    """The released text_config has neither layer_types nor sliding_window_pattern:
    transformers' Gemma3TextConfig default makes every 6th layer global."""
    layers = kvpool_layers(FILES[0].parent / "gemma-3-27b-it.json")
    assert summary(layers) == "52 sliding(1024) + 10 full"
    # 16 KV heads x (128 + 128) values x 2 bytes per layer
    assert {e[2] for layer in layers for e in layer} == {16 * 256 * 2}
    assert [i for i, layer in enumerate(layers) if layer[0][0] == "full"] == list(range(5, 62, 6))


def test_gemma_3_4b_minimal_text_config_gets_the_class_defaults() -> None:
    """No heads, KV heads or head_dim in its text_config: Gemma3TextConfig's 4 KV heads of 256."""
    raw = json.loads((FILES[0].parent / "gemma-3-4b-it.json").read_text())
    assert "num_key_value_heads" not in raw["text_config"]
    layers = kvpool_layers(FILES[0].parent / "gemma-3-4b-it.json")
    assert layers == hf_layers(raw)
    assert summary(layers) == "29 sliding(1024) + 5 full"
    assert layers[0] == (("sliding", 1024, 4 * 512 * 2),)


def test_the_comparison_sees_a_wrong_reading() -> None:
    """The checker itself: a kvpool that read gemma-3-27b as 62 sliding layers
    (the bug this corpus guards against) differs on exactly the 10 global layers."""
    good = compare(FILES[0].parent / "gemma-3-27b-it.json")
    sliding = next(layer for layer in good.kvpool if layer[0][0] == "sliding")
    wrong = Row(good.model, good.model_type, [sliding] * 62, good.hf)
    assert wrong.differing_layers == list(range(5, 62, 6))
    assert wrong.verdict == "differ"
    short = Row(good.model, good.model_type, good.kvpool[:61], good.hf)
    assert short.differing_layers == [61]


def test_the_checked_in_table_is_current() -> None:
    expected = render([compare(p) for p in FILES])
    assert TABLE.read_text() == expected, "regenerate: .venv/bin/python tests/corpus_layers.py"
