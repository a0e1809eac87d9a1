"""`kvpool plan --engine / --emit`: the engine's split beside the plan, the launch."""

from __future__ import annotations

import json

import pytest

from kvpool.cli.main import main

GPT = ["plan", "gpt-oss-20b", "--kv-memory", "20GiB", "--max-seq-len", "32768"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_engine_report_beside_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, *GPT, "--engine", "sglang")
    assert "policy reference" in out
    full = int(20 * 2**30 // (24576 * 1.8))
    assert f"prints: KV Cache is allocated. #tokens: {full}," in out
    assert "requests that fit at once (engine / kvpool)" in out


def test_engine_json_adds_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, *GPT, "--engine", "vllm", "--json"))
    assert data["policy"] == "reference"
    assert data["engine"]["engine"] == "vllm"
    assert data["engine"]["reported"]["gpu_kv_cache_tokens"] > 0
    assert set(data["engine"]["max_concurrency"]) == {"reference", "avg_seq_len", "max_seq_len"}


@pytest.mark.parametrize("engine,key", [("vllm", "argv"), ("sglang", "argv"), ("trtllm", "config")])
def test_emit_json_shape(capsys: pytest.CaptureFixture[str], engine: str, key: str) -> None:
    data = json.loads(run(capsys, *GPT, "--emit", engine, "--json"))
    assert set(data) == {"engine", "version_modelled", key, "pools", "reported", "notes"}
    assert data["engine"] == engine and data["pools"]


def test_emit_vllm_flags_follow_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, *GPT, "--emit", "vllm", "--json"))
    argv = data["argv"]
    assert argv[:3] == ["vllm", "serve", "openai/gpt-oss-20b"]
    flag = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1, 2)}
    assert flag["--kv-cache-memory-bytes"] == str(20 * 2**30)
    assert flag["--max-model-len"] == "32768" and flag["--block-size"] == "32"
    assert json.loads(flag["--compilation-config"])["cudagraph_capture_sizes"][:3] == [1, 2, 4]
    assert any("one shared block pool" in n for n in data["notes"])


def test_emit_sglang_reproduces_the_plan_pools(capsys: pytest.CaptureFixture[str]) -> None:
    plan = json.loads(run(capsys, *GPT, "--json"))
    pages = {g["name"]: g["pages"] for g in plan["groups"]}
    data = json.loads(run(capsys, *GPT, "--emit", "sglang", "--json"))
    argv = data["argv"]
    assert argv[argv.index("--max-total-tokens") + 1] == str(pages["full"] * 32)
    tokens = {p["name"]: p["tokens"] for p in data["pools"]}
    assert tokens == {"full": pages["full"] * 32, "swa": pages["sliding"] * 32}


def test_emit_text_prints_command_and_notes(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(
        capsys,
        "plan",
        "gemma-3-27b",
        "--kv-memory",
        "20GiB",
        "--max-seq-len",
        "32768",
        "--model-id",
        "my/gemma",
        "--emit",
        "vllm",
    )
    assert "vllm serve my/gemma --kv-cache-memory-bytes 21474836480" in out
    assert "# note: vLLM pads 8 empty layers" in out


def test_emit_trtllm_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, *GPT, "--avg-seq-len", "4096", "--emit", "trtllm")
    assert "kv_cache_config:\n  max_gpu_total_bytes: 21474836480\n  tokens_per_block: 32" in out
    assert "  avg_seq_len: 4096" in out and "cuda_graph_config:\n  batch_sizes: [1, 2, 4," in out


def test_unmodelled_engine_layout_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "deepseek-v4-flash", "--kv-memory", "40GiB", "--engine", "vllm"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "compressed" in err


# What vLLM 0.32's own get_kv_cache_capacity gives for Gemma-3-27B at 20 GiB, L 32768,
# max_num_batched_tokens 8192 (tests/engines_truth/ cases gemma3-27b-20g and -sync;
# tests/test_engines_truth.py recomputes them with vLLM's code whenever its side venv is built).
GEMMA3 = ["plan", "gemma-3-27b", "--kv-memory", "20GiB", "--max-seq-len", "32768"]


@pytest.mark.parametrize("engine", ["vllm", "vllm@0.32"])
def test_plan_engine_vllm_prints_what_vllm_032_prints(capsys: pytest.CaptureFixture[str], engine: str) -> None:
    out = run(capsys, *GEMMA3, "--engine", engine)
    assert "prints: GPU KV cache size: 62,557 tokens, Maximum concurrency for 32,768 tokens per request: 1.91x" in out


def test_no_async_scheduling_keeps_one_batch_in_flight(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, *GEMMA3, "--engine", "vllm", "--no-async-scheduling")
    assert "prints: GPU KV cache size: 97,435 tokens, Maximum concurrency for 32,768 tokens per request: 2.97x" in out


def test_plan_engine_vllm_keeps_a_window_as_long_as_the_context(capsys: pytest.CaptureFixture[str]) -> None:
    # Gemma-2-9B's window is 4096: at --max-seq-len 4096 kvpool's plan treats it as full
    # attention, vLLM keeps its sliding group (2 groups, 4,291 blocks from 11 GiB; case gemma2-9b-L4096).
    data = json.loads(
        run(capsys, "plan", "gemma-2-9b", "--kv-memory", "11GiB", "--max-seq-len", "4096", "--engine", "vllm", "--json")
    )
    assert data["engine"]["reported"]["kv_cache_groups"] == 2
    assert data["engine"]["reported"]["num_gpu_blocks"] == 4291
    assert data["engine"]["reported"]["gpu_kv_cache_tokens"] == 34261


def test_block_size_reaches_the_vllm_model(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, *GEMMA3, "--engine", "vllm", "--block-size", "32", "--json"))
    assert data["engine"]["reported"]["block_size"] == 32


@pytest.mark.parametrize("name", ["vllm@0.10", "vlm"])
def test_unknown_engine_or_release_is_a_usage_error(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert main([*GEMMA3, "--engine", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert name.split("@")[0] in err[-1]
