"""Multi-token-prediction layers: not loaded by default, loaded (and counted in the
weights per rank) when they draft tokens (--draft-len > 0), named as DeepSeek names
them (model.layers.{L+i}) or under mtp.*."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvpool.models.weights import Parallel, model_weights
from weights_helpers import save_tensors, tiny_config

pytest.importorskip("safetensors")


def checkpoint(folder: Path, mtp_names: list[str]) -> dict[str, Any]:
    """A llama-shaped tiny checkpoint of 3 decoder layers plus the given MTP tensors,
    each tensor 2,000 float32 bytes; returns its config."""
    config = {**tiny_config("llama"), "num_nextn_predict_layers": 1}
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(3)] + mtp_names
    save_tensors(folder / "model.safetensors", {n: np.zeros((10, 50), dtype="float32") for n in names})
    (folder / "config.json").write_text(json.dumps(config))
    return config


@pytest.mark.parametrize(
    "mtp_names",
    [
        ["model.layers.3.mlp.down_proj.weight", "model.layers.3.eh_proj.weight"],  # DeepSeek-V3
        ["mtp.layers.0.mlp.down_proj.weight", "mtp.fc.weight"],  # Qwen3-Next
    ],
)
def test_mtp_layers_load_only_when_they_draft(tmp_path: Path, mtp_names: list[str]) -> None:
    config = checkpoint(tmp_path, mtp_names)
    weights = model_weights(config, tmp_path)
    assert weights.total_bytes == 3 * 2000  # the decoder only
    drafting = weights.with_draft_layers(1)
    assert drafting.total_bytes == 5 * 2000 and "MTP" in drafting.source
    # under pipeline parallelism the MTP layer sits on the last stage
    stages = drafting.stage_bytes(Parallel(pp=2))
    assert stages[-1] > weights.stage_bytes(Parallel(pp=2))[-1]
    assert stages[0] == weights.stage_bytes(Parallel(pp=2))[0]


def test_the_budget_counts_them_with_draft_len(tmp_path: Path, cli: Any) -> None:
    config = checkpoint(tmp_path, ["model.layers.3.mlp.down_proj.weight"])
    length = str(config["max_position_embeddings"])  # a longer --max-seq-len is refused
    args = ["plan", str(tmp_path), "--gpu", "h100", "--max-seq-len", length, "--json"]
    code, out, err = cli(*args)
    assert code == 0, err
    plain = json.loads(out)["memory"]["weights_bytes"]
    code, out, err = cli(*args, "--draft-len", "2")
    assert code == 0, err
    assert json.loads(out)["memory"]["weights_bytes"] == plain + 2000
