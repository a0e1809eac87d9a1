"""`kvpool inspect | models | gpus` and their error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_inspect_json_shape(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("inspect", "gemma-4-26b-a4b", "--kv-dtype", "fp8", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {
        "model",
        "source",
        "kv_dtype",
        "kv_dtype_note",
        "tp_size",
        "pp_stage",
        "tokens_per_block",
        "groups",
        "full_attention_bytes_per_token",
        "parameters",
        "weights_bytes",
    }
    assert data["parameters"] is None and data["weights_bytes"] is None  # no formula for Gemma 4
    assert (data["model"], data["kv_dtype"], data["tp_size"], data["tokens_per_block"]) == (
        "gemma-4-26b-a4b",
        "fp8",
        1,
        32,
    )
    assert (data["source"]["kind"], data["source"]["repo_id"], data["source"]["folder"]) == ("preset", None, None)
    by_name = {g["name"]: g for g in data["groups"]}
    assert by_name["sliding"] == {
        "name": "sliding",
        "kind": "sliding",
        "window": 1024,
        "ratio": None,
        "num_layers": 25,
        "page_bytes": 32 * 25 * 2 * 8 * 256,
        "bytes_per_request": 0,
    }
    # 5 global layers x (K + V) x 2 heads x 512 x 1 byte
    assert data["full_attention_bytes_per_token"] == 5 * 2 * 2 * 512


def test_inspect_json_weights_of_llama_70b_at_tp_8(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("inspect", "llama-3.1-70b", "--tp", "8", "--json")
    assert code == 0, err
    data = json.loads(out)
    # published config: V 128256, H 8192, I 28672, 80 layers, 64 heads / 8 KV heads of 128, untied
    v, h, inter, layers, q, kv = 128256, 8192, 28672, 80, 64 * 128, 8 * 128
    layer = h * q * 2 + h * kv * 2 + 3 * h * inter + 2 * h
    assert data["parameters"] == 2 * v * h + layers * layer + h
    # tp 8, bf16: every matrix split 8 ways (8 KV heads, one per rank); norms on every rank
    per_layer = 2 * (layer - 2 * h) // 8 + 2 * 2 * h
    assert data["weights_bytes"] == 2 * 2 * v * h // 8 + layers * per_layer + 2 * h


def test_inspect_state_group_json(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("inspect", "qwen3-next-80b-a3b", "--json")
    state = next(g for g in json.loads(out)["groups"] if g["kind"] == "state")
    assert code == 0 and state["page_bytes"] == 0 and state["bytes_per_request"] > 0


def test_inspect_table(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("inspect", "deepseek-v4-flash", "--tp", "2")
    assert code == 0
    assert "compressor_state" in out and "1 row / 128 tokens" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("inspect", "qwen-8b"), "qwen3-8b"),
        (("inspect", "qwen3-8b", "--kv-dtype", "int3"), "unsupported kv dtype"),
        (("inspect", "qwen3-8b", "--tp", "0"), "--tp"),
        (("inspect", "deepseek-v4-flash", "--tokens-per-block", "32"), "multiple of compress ratio"),
    ],
)
def test_inspect_errors_are_one_line_exit_2(cli, args, needle) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert needle in err and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_inspect_malformed_file(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "config.json"
    bad.write_text("{")
    code, _, err = cli("inspect", str(bad))
    assert code == 2 and str(bad) in err and err.count("\n") == 1


def test_inspect_missing_field(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 2}))
    code, _, err = cli("inspect", str(cfg))
    assert code == 2 and "num_attention_heads" in err


def test_models_and_gpus_json(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("models", "--json")
    names = [m["name"] for m in json.loads(out)["models"]]
    assert code == 0 and "qwen3-8b" in names and len(names) == 17
    code, out, _ = cli("gpus", "--json")
    gpus = {g["name"]: g for g in json.loads(out)["gpus"]}
    first = ["a10", "l40s", "a100", "h100", "h200", "b200", "gb200", "mi300x"]
    issue_30 = ["h20", "l4", "l40", "rtx4090", "rtx5090", "b300", "gb300", "mi325x", "mi355x"]
    assert code == 0 and sorted(gpus) == sorted(first + issue_30)
    # H100 SXM reports 81559 MiB to nvidia-smi
    assert gpus["h100"]["memory_bytes"] == 81559 * 2**20


def test_gpu_names_are_case_insensitive() -> None:
    from kvpool.presets import load_gpu

    assert load_gpu("H200").key == load_gpu("h200").key == "h200"


def test_a_reader_that_leaves_early_is_not_an_error(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # `kvpool inspect ... --json | head -1`: the pipe closes under the writer
    import kvpool.cli.inspect_cmd as cmd

    def closed_pipe(obj: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cmd, "print_json", closed_pipe)
    code, _, err = cli("inspect", "qwen3-8b", "--json")
    assert code == 0 and err == ""
