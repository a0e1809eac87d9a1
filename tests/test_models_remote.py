"""A Hugging Face id whose weights are not cached: exact bytes from the remote
safetensors headers (header bytes only, through huggingface_hub's
get_safetensors_metadata, here a stand-in), cached per commit; offline or
unreachable, the config.json count instead."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import pytest

from hub_helpers import GEMMA3_CONFIG, GEMMA3_ID, GEMMA3_SHA, lay_out_snapshot
from kvpool.models.remote_headers import cache_dir, hub_snapshot
from kvpool.models.weights import model_weights
from kvpool.spec.defaults import with_defaults

pytest.importorskip("huggingface_hub")

# a stand-in checkpoint: 62 layers' worth of one 1000-byte tensor each, an embedding,
# and a vision tower (bytes chosen here, nothing from kvpool's formulas)
TENSORS = {
    "model.safetensors": {
        "language_model.model.embed_tokens.weight": ("BF16", [262208, 5376]),
        **{f"language_model.model.layers.{i}.mlp.down_proj.weight": ("BF16", [500]) for i in range(62)},
        "vision_tower.vision_model.post_layernorm.weight": ("BF16", [1152]),
    }
}


def metadata() -> Any:
    files = {}
    for file, tensors in TENSORS.items():
        infos, offset = {}, 0
        for name, (dtype, shape) in tensors.items():
            size = 2 * int(math.prod(shape))
            infos[name] = types.SimpleNamespace(dtype=dtype, shape=shape, data_offsets=(offset, offset + size))
            offset += size
        files[file] = types.SimpleNamespace(tensors=infos, metadata={})
    return types.SimpleNamespace(files_metadata=files, sharded=False)


EXPECTED = sum(2 * math.prod(shape) for t in TENSORS.values() for _, shape in t.values())


@pytest.fixture
def snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, list[str]]:
    """An online hub cache holding only config.json, a reachable Hub, kvpool's cache
    in tmp_path, and a stand-in get_safetensors_metadata that records its calls."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("KVPOOL_CACHE", str(tmp_path / "kvpool"))
    monkeypatch.setattr("kvpool.models.remote_headers.check_reachable", lambda name, cache: None)
    calls: list[str] = []

    def fake(repo_id: str, *, revision: str | None = None, **kwargs: Any) -> Any:
        calls.append(f"{repo_id}@{revision}")
        return metadata()

    monkeypatch.setattr("huggingface_hub.get_safetensors_metadata", fake)
    folder = lay_out_snapshot(tmp_path / "hub", GEMMA3_ID, {"config.json": GEMMA3_CONFIG}, commit=GEMMA3_SHA)
    return folder, calls


def config() -> dict[str, Any]:
    raw = json.loads(GEMMA3_CONFIG.read_text())
    return with_defaults({**{k: v for k, v in raw.items() if k != "text_config"}, **raw["text_config"]})


def test_remote_headers_give_the_bytes_once(snapshot: tuple[Path, list[str]]) -> None:
    folder, calls = snapshot
    assert hub_snapshot(folder) == (GEMMA3_ID, GEMMA3_SHA)
    weights = model_weights(config(), folder)
    assert weights.total_bytes == EXPECTED and "remote, header bytes only" in weights.source
    assert calls == [f"{GEMMA3_ID}@{GEMMA3_SHA}"]
    again = model_weights(config(), folder)  # from kvpool's cache: the Hub is not asked again
    assert again.total_bytes == EXPECTED and len(calls) == 1
    assert (cache_dir() / f"{GEMMA3_ID.replace('/', '--')}@{GEMMA3_SHA}.json").is_file()


def test_offline_counts_from_the_config(snapshot: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, calls = snapshot
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    weights = model_weights(config(), folder)
    assert calls == [] and weights.source.startswith("config.json")


def test_a_hub_failure_counts_from_the_config(
    snapshot: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = snapshot

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise OSError("connection reset")

    monkeypatch.setattr("huggingface_hub.get_safetensors_metadata", failing)
    assert model_weights(config(), folder).source.startswith("config.json")


def test_a_path_or_preset_never_asks_the_hub(snapshot: tuple[Path, list[str]], tmp_path: Path) -> None:
    _, calls = snapshot
    (tmp_path / "local").mkdir()
    model_weights(config(), tmp_path / "local")
    model_weights(config(), "gemma-3-27b")
    assert calls == []
