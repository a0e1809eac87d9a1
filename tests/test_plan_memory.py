"""`kvpool plan MODEL --gpu NAME --tp N` without --non-kv-memory: the whole GPU per
rank, every part derived here by hand from the published Llama-3.1-70B config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli.main import main
from kvpool.presets import load_gpu
from weights_helpers import TINY, random_tensors, save_tensors, write_config

GiB = 2**30
# Llama-3.1-70B (tests/data/configs/Meta-Llama-3.1-70B.json)
V, H, INTER, LAYERS, HEADS, KV_HEADS, D = 128256, 8192, 28672, 80, 64, 8, 128
LLAMA_70B = ["plan", "llama-3.1-70b", "--gpu", "h100", "--kv-dtype", "fp8", "--max-seq-len", "8192"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def memory_of(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    assert data["budget_bytes"] == data["memory"]["kv_bytes"]
    memory: dict[str, Any] = data["memory"]
    return memory


def test_llama_70b_on_h100_at_tp_4_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    m = memory_of(capsys, *LLAMA_70B, "--tp", "4")
    gpu = load_gpu("h100").memory_bytes
    layer = 2 * (2 * H * HEADS * D + 2 * H * KV_HEADS * D + 3 * H * INTER)  # bf16 matrices of one layer
    weights = 2 * 2 * V * H // 4 + LAYERS * (layer // 4 + 2 * 2 * H) + 2 * H
    per_token = 2 * (2 * H + (HEADS + 2 * KV_HEADS) * D // 4 + 3 * INTER // 4)
    forward = 8192 * per_token
    # vLLM's dummy sampler on min(256, 8192) rows, the forward pass's 8192 output rows still held: the picked
    # rows and their random stand-in (bf16), then bf16 logits + float32 logits, probabilities and noise
    sampler = 2 * (8192 + 2 * 256) * H + (2 + 3 * 4) * 256 * V
    activations = max(forward, sampler)
    assert activations == forward  # 70B at tp 4: the forward pass's peak is the larger
    graphs = 256 * per_token  # default graph sizes end at min(B, 256) = 256
    how = m.pop("how")  # where each part comes from, in words: each estimate says so
    assert set(how) == {"weights", "activation", "cuda_graph", "reserved"}
    assert how["activation"].startswith("estimate") and how["cuda_graph"].startswith("estimate")
    assert m == {
        "gpu_bytes": gpu,
        "utilization": 0.9,
        "weights_bytes": weights,
        "activation_bytes": activations,
        "cuda_graph_bytes": graphs,
        "reserved_bytes": 0,  # vLLM's budget has no reserve (plan/memory.py)
        "kv_bytes": int(gpu * 0.9) - weights - activations - graphs,
        "per_rank": True,
    }


def test_every_estimate_can_be_given(capsys: pytest.CaptureFixture[str]) -> None:
    m = memory_of(
        capsys,
        *LLAMA_70B,
        "--tp",
        "4",
        "--gpu-memory-utilization",
        "0.8",
        "--weights-memory",
        "30GiB",
        "--activation-memory",
        "2GiB",
        "--cuda-graph-memory",
        "0",
        "--reserved-memory",
        "512MiB",
    )
    gpu = load_gpu("h100").memory_bytes
    assert m["kv_bytes"] == int(gpu * 0.8) - 30 * GiB - 2 * GiB - GiB // 2
    assert (m["utilization"], m["cuda_graph_bytes"]) == (0.8, 0)


def test_text_output_shows_the_breakdown_and_the_convention(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *LLAMA_70B, "--tp", "4")
    assert code == 0, err
    assert "gpu_memory_utilization" in out
    for row in ("h100 x 0.9", "- weights", "- activations", "- CUDA graphs", "- reserved", "= KV cache"):
        assert row in out


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["plan", "llama-3.1-70b", "--gpu", "h100"], ("by", "more --tp (now 1)")),
        (
            ["plan", "llama-3.1-8b-instruct", "--gpu", "h100", "--activation-memory", "70GiB"],
            ("smaller --max-num-tokens",),
        ),
    ],
)
def test_a_negative_budget_is_one_line_saying_what_to_change(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: tuple[str, ...]
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "no memory left for the KV cache" in err
    assert all(n in err for n in needles), err


def test_weights_of_a_folder_come_from_its_safetensors_headers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_config(tmp_path / "tiny", {"model_type": "llama", **TINY, "torch_dtype": "float16"})
    shapes = {"model.embed_tokens.weight": (96, 32), "lm_head.weight": (96, 32), "model.norm.weight": (32,)}
    for i in range(3):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.self_attn.{x}_proj.weight": (32 if x in "qo" else 16, 32) for x in "qkvo"}
        shapes |= {f"{p}.mlp.{x}_proj.weight": (48, 32) if x != "down" else (32, 48) for x in ("gate", "up", "down")}
        shapes |= {f"{p}.input_layernorm.weight": (32,), f"{p}.post_attention_layernorm.weight": (32,)}
    tensors = random_tensors(7, shapes, "float16")
    save_tensors(folder / "model.safetensors", tensors)
    m = memory_of(capsys, "plan", str(folder), "--gpu", "h100")
    assert m["weights_bytes"] == sum(a.nbytes for a in tensors.values())


def test_simulate_plans_the_same_per_rank_budget(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len,output_len,arrival_s\n" + "\n".join(f"{100 + i},{10},{i * 0.1:.1f}" for i in range(5)))
    common = ["llama-3.1-8b-instruct", "--gpu", "h100", "--tp", "2", "--max-seq-len", "4096"]
    code, out, err = run(capsys, "plan", *common, "--json")
    assert code == 0, err
    plan = json.loads(out)
    code, out, err = run(capsys, "simulate", *common, "--trace", str(trace), "--quiet", "--json")
    assert code == 0, err
    pages = json.loads(out)["runs"][0]["pages"]["full"]["total"]
    assert pages == plan["groups"][0]["pages"]
