"""Every CLI command takes a Hugging Face id for MODEL, read from a hub cache laid
out in tmp_path with HF_HUB_OFFLINE=1 (tests/hub_helpers.py): nothing is
downloaded. google/gemma-3-27b-it's published config has 62 layers, 16 KV heads
of 128 dims and bf16; transformers' default sliding_window_pattern 6 makes every
6th layer global: 52 sliding + 10 full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hub_helpers import GEMMA3_ID, GEMMA3_SHA, gemma3_hub

pytest.importorskip("huggingface_hub")

SRC = Path(__file__).resolve().parents[1] / "src"


def page_bytes(layers: int) -> int:
    """32 positions x layers x (K + V) x 16 heads x 128 dims x 2 bytes (bf16)."""
    return 32 * layers * 2 * 16 * 128 * 2


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError(f"network download attempted: {args}")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)
    return gemma3_hub(monkeypatch, tmp_path)


def test_plan_with_an_id_in_a_fresh_process(hub: Path, tmp_path: Path) -> None:
    """The real console entry point: huggingface_hub imported with the env set."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    argv = ["plan", GEMMA3_ID, "--kv-memory", "16GiB", "--max-seq-len", "8192", "--json"]
    run = subprocess.run(
        [sys.executable, "-m", "kvpool", *argv], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    groups = {g["name"]: g for g in json.loads(run.stdout)["groups"]}
    assert {name: g["page_bytes"] for name, g in groups.items()} == {
        "sliding": page_bytes(52),
        "full": page_bytes(10),
    }
    assert groups["sliding"]["window"] == 1024
    assert sum(g["bytes"] for g in groups.values()) <= 16 * 2**30


def test_inspect_json_and_text_say_where_the_spec_came_from(hub: Path, cli: Any) -> None:
    code, out, err = cli("inspect", GEMMA3_ID, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert {g["kind"]: g["num_layers"] for g in data["groups"]} == {"sliding": 52, "full": 10}
    assert data["model"] == GEMMA3_ID
    assert data["source"] == {
        "kind": "hub",
        "name": GEMMA3_ID,
        "config_path": str(hub / "config.json"),
        "folder": str(hub),
        "repo_id": GEMMA3_ID,
        "revision": "main",
        "commit": GEMMA3_SHA,
    }
    code, out, _ = cli("inspect", f"{GEMMA3_ID}@{GEMMA3_SHA}")
    assert code == 0 and f"source: hub {GEMMA3_ID}@{GEMMA3_SHA} (commit {GEMMA3_SHA[:12]}" in out


def test_warmup_with_an_id(hub: Path, cli: Any) -> None:
    argv = [
        "--kv-memory",
        "4GiB",
        "--max-seq-len",
        "4096",
        "--max-batch-size",
        "4",
        "--cuda-graph-batch-sizes",
        "1,2,4",
    ]
    code, out, err = cli("warmup", GEMMA3_ID, *argv, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["skipped"] == [] and [b for b, _ in report["captured"]] == [1, 2, 4]


def test_simulate_with_an_id(hub: Path, cli: Any, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "prompt_len,output_len,arrival_s\n" + "".join(f"{300 + 50 * i},8,{0.05 * i:.2f}\n" for i in range(6))
    )
    argv = ["--gpu", "h100", "--kv-memory", "4GiB", "--max-seq-len", "4096", "--max-batch-size", "4"]
    argv += ["--max-num-tokens", "1024", "--weights-bytes", "54GB", "--trace", str(trace), "--quiet", "--json"]
    code, out, err = cli("simulate", GEMMA3_ID, *argv)
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert set(run["pages"]) == {"sliding", "full"} and run["output_tokens_per_s"] > 0


def test_generate_with_an_id_whose_weights_are_not_cached(hub: Path, cli: Any) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    code, out, err = cli("generate", GEMMA3_ID, "--prompt-ids", "1")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert GEMMA3_ID in err and "no *.safetensors" in err and f"hf download {GEMMA3_ID}" in err


def test_emitted_launch_names_the_repo_and_the_revision(hub: Path, cli: Any) -> None:
    argv = ["--kv-memory", "16GiB", "--max-seq-len", "8192", "--emit", "vllm", "--json"]
    code, out, err = cli("plan", f"{GEMMA3_ID}@{GEMMA3_SHA}", *argv)
    assert code == 0, err
    emitted = json.loads(out)  # --emit --json prints the launch object
    assert emitted["argv"][:3] == ["vllm", "serve", GEMMA3_ID]
    assert any(GEMMA3_SHA in note for note in emitted["notes"])


def gemma3_27b_text_bytes() -> int:
    """bf16 bytes of gemma-3-27b-it's decoder, by hand from its config (hidden
    5376, 62 layers, 32 query / 16 KV heads of 128, MLP 21504) and
    Gemma3TextConfig's defaults for what it omits (vocab 262208, tied
    embeddings): embeddings + per layer q, k, v, o, q/k norms, gate/up/down and
    four norms + the final norm."""
    h, heads, kv, d, mlp = 5376, 32, 16, 128, 21504
    layer = h * heads * d * 2 + h * kv * d * 2 + 2 * d + 3 * h * mlp + 4 * h
    return 2 * (262208 * h + 62 * layer + h)


def gemma3_27b_tower_bytes() -> int:
    """Its SigLIP vision tower and projector (vision_config: Hv 1152, I 4304, 27 layers,
    patch 14 at 896 px, no pooling head), bf16: per layer q/k/v/o with biases, fc1/fc2
    with biases, two LayerNorms; patch + position embeddings, post LayerNorm, projector."""
    hv, inter, layers, h = 1152, 4304, 27, 5376
    layer = 4 * (hv * hv + hv) + 2 * hv * inter + inter + hv + 4 * hv
    embeddings = hv * 3 * 14 * 14 + hv + (896 // 14) ** 2 * hv
    return 2 * (layers * layer + embeddings + 2 * hv + hv * h + hv)


def test_plan_with_an_id_and_the_whole_gpu(hub: Path, cli: Any) -> None:
    """`kvpool plan google/gemma-3-27b-it --gpu h100`: offline, from the cache,
    no --non-kv-memory; the weights are the decoder's and the vision tower's (the
    tower takes memory the KV cache cannot have) and the KV budget is what the
    breakdown leaves."""
    code, out, err = cli("plan", GEMMA3_ID, "--gpu", "h100", "--max-seq-len", "8192", "--json")
    assert code == 0, err
    memory = json.loads(out)["memory"]
    assert memory["weights_bytes"] == gemma3_27b_text_bytes() + gemma3_27b_tower_bytes()
    rest = int(memory["gpu_bytes"] * memory["utilization"]) - sum(
        memory[k] for k in ("weights_bytes", "activation_bytes", "cuda_graph_bytes", "reserved_bytes")
    )
    assert abs(memory["kv_bytes"] - rest) <= 1 and memory["per_rank"] is True
