"""MODEL as a preset, a path or a Hugging Face id (kvpool.models): precedence,
revisions, the offline cache, and one-line errors. Every hub test runs on a cache
laid out in tmp_path (tests/hub_helpers.py) with hf_hub_download replaced: no
test can reach the network."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from hub_helpers import (
    GEMMA3_CONFIG,
    GEMMA3_ID,
    GEMMA3_SHA,
    MODELOPT_DIR,
    MODELOPT_ID,
    gemma3_hub,
    lay_out_snapshot,
    offline_hub,
)
from kvpool import load_model_spec
from kvpool.errors import ModelSourceError, UnknownPresetError
from kvpool.models import FORMS, resolve_model

pytest.importorskip("huggingface_hub")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """hf_hub_download (kvpool's only network call) fails the test if reached."""
    calls: list[tuple[Any, ...]] = []

    def refuse(*args: Any, **kwargs: Any) -> str:
        calls.append(args)
        raise AssertionError(f"network download attempted: {args}")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return calls


def test_hub_id_resolves_to_the_cache_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    snapshot = gemma3_hub(monkeypatch, tmp_path)
    found = resolve_model(GEMMA3_ID)
    assert (found.kind, found.repo_id, found.revision, found.commit) == ("hub", GEMMA3_ID, "main", GEMMA3_SHA)
    assert found.folder == snapshot and found.config_path == snapshot / "config.json"
    assert json.loads(found.config_path.read_text()) == json.loads(GEMMA3_CONFIG.read_text())


def test_gemma3_from_the_cache_has_52_sliding_and_10_full_layers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gemma3_hub(monkeypatch, tmp_path)
    spec = load_model_spec(GEMMA3_ID)
    # 62 layers, transformers' default sliding_window_pattern 6: every 6th is global
    layers = {g.kind: len(g.layers) for g in spec.groups}
    assert layers == {"sliding": 62 - 62 // 6, "full": 62 // 6} == {"sliding": 52, "full": 10}
    assert spec.name == GEMMA3_ID and spec.source is not None and spec.source.commit == GEMMA3_SHA


def test_preset_wins_over_a_folder_of_the_same_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "qwen3-8b").mkdir()
    shutil.copy(GEMMA3_CONFIG, tmp_path / "qwen3-8b" / "config.json")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("qwen3-8b").kind == "preset"
    assert resolve_model("./qwen3-8b").kind == "path"


def test_existing_path_wins_over_a_cached_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gemma3_hub(monkeypatch, tmp_path)
    local = tmp_path / "work" / "google" / "gemma-3-27b-it"
    local.mkdir(parents=True)
    shutil.copy(GEMMA3_CONFIG, local / "config.json")
    monkeypatch.chdir(tmp_path / "work")
    found = resolve_model(GEMMA3_ID)
    assert (found.kind, found.config_path, found.repo_id) == ("path", Path(GEMMA3_ID) / "config.json", None)


def test_revision_through_refs_and_as_a_raw_sha(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gemma3_hub(monkeypatch, tmp_path)
    # another commit, reachable by the tag v1 and by its sha: gemma-3-4b-it's
    # published config (34 layers: 34 // 6 = 5 global)
    other = hashlib.sha1(b"another commit").hexdigest()
    small = Path(GEMMA3_CONFIG).with_name("gemma-3-4b-it.json")
    lay_out_snapshot(tmp_path / "hub", GEMMA3_ID, {"config.json": small}, commit=other, refs=("v1",))
    for model in (f"{GEMMA3_ID}@v1", f"{GEMMA3_ID}@{other}"):
        spec = load_model_spec(model)
        assert {g.kind: len(g.layers) for g in spec.groups} == {"sliding": 29, "full": 5}, model
        assert spec.source is not None and spec.source.commit == other
    assert resolve_model(f"{GEMMA3_ID}@main").commit == GEMMA3_SHA
    assert resolve_model(f"{GEMMA3_ID}@{GEMMA3_SHA}").commit == GEMMA3_SHA


def test_sidecar_quant_config_is_read_from_the_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = {name: MODELOPT_DIR / name for name in ("config.json", "hf_quant_config.json")}
    lay_out_snapshot(tmp_path / "hub", MODELOPT_ID, files, commit="c" * 40)
    offline_hub(monkeypatch, tmp_path / "hub")
    # hf_quant_config.json says kv_cache_quant_algo FP8; config.json says nothing
    assert "quantization_config" not in json.loads((MODELOPT_DIR / "config.json").read_text())
    assert load_model_spec(MODELOPT_ID).kv_dtype == "fp8"


def test_offline_miss_is_one_line_naming_the_id_and_nothing_is_downloaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_network: list[tuple[Any, ...]], cli: Any
) -> None:
    gemma3_hub(monkeypatch, tmp_path)
    for model in ("google/gemma-3-12b-it", f"{GEMMA3_ID}@v9"):
        code, out, err = cli("inspect", model)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert model in err and "HF_HUB_OFFLINE" in err and "Traceback" not in err
    assert no_network == []


def test_hf_home_is_honoured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lay_out_snapshot(tmp_path / "home" / "hub", GEMMA3_ID, {"config.json": GEMMA3_CONFIG}, commit=GEMMA3_SHA)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert resolve_model(GEMMA3_ID).folder == tmp_path / "home" / "hub" / "models--google--gemma-3-27b-it" / (
        "snapshots/" + GEMMA3_SHA
    )


@pytest.mark.parametrize(
    "model", ["google/", "/gemma", "a--b/c", "a/b/c", "google/gemma@", "org/na me", "@main", "x/y@a b"]
)
def test_malformed_ids_list_the_three_forms(model: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        resolve_model(model)
    except ModelSourceError as e:
        assert FORMS in str(e) and model in str(e)
    else:
        # "/gemma" looks like a path: it resolves to one, and reading it says it is missing
        assert model == "/gemma" and resolve_model(model).kind == "path"


def test_empty_model_is_not_a_missing_config_json(cli: Any) -> None:
    code, out, err = cli("inspect", "")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "does not exist" not in err and "org/name[@revision]" in err and "preset" in err


def test_unknown_bare_word_suggests_presets_and_names_the_forms() -> None:
    with pytest.raises(UnknownPresetError) as e:
        resolve_model("qwen3-8")
    assert "qwen3-8b" in e.value.suggestions and FORMS in str(e.value)


def test_missing_huggingface_hub_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gemma3_hub(monkeypatch, tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(ModelSourceError, match=r"pip install 'kvpool\[hub\]'"):
        resolve_model(GEMMA3_ID)
