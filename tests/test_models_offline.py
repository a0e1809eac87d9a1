"""A Hugging Face id on a machine that cannot reach the Hub: one connect probe, one
line, no retry loop (huggingface_hub's backoff once took ~25 s), and a
bundled preset stands in when one describes the same model, saying so."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from kvpool.models.hub import HubUnreachableError, hub_config
from kvpool.models.source import preset_for_hub_id, resolve_model

pytest.importorskip("huggingface_hub")


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, int]]:
    """Not offline, an empty cache, an endpoint whose port refuses at once
    (127.0.0.1:1), and hf_hub_download failing the test if it is ever reached."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    probes: list[tuple[str, int]] = []
    connect = socket.create_connection

    def counted(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        probes.append(address)
        return connect(address, *args, **kwargs)

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("huggingface_hub's download (and its retries) ran for an unreachable Hub")

    monkeypatch.setattr(socket, "create_connection", counted)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)
    return probes


def test_an_unreachable_hub_fails_in_one_probe(unreachable: list[tuple[str, int]], tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(HubUnreachableError, match="cannot be reached"):
        hub_config("someorg/some-model", "someorg/some-model", "main")
    assert time.monotonic() - start < 5 and unreachable == [("127.0.0.1", 1)]


def test_an_unknown_id_is_one_line_exit_2(unreachable: list[tuple[str, int]], cli: Any) -> None:
    start = time.monotonic()
    code, out, err = cli("inspect", "someorg/some-model")
    assert time.monotonic() - start < 5
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "someorg/some-model" in err and "HF_ENDPOINT" in err


def test_a_preset_stands_in_and_says_so(unreachable: list[tuple[str, int]], cli: Any) -> None:
    code, out, err = cli("plan", "Qwen/Qwen3-8B", "--kv-memory", "4GiB", "--max-seq-len", "4096", "--json")
    assert code == 0, err
    assert "using the bundled preset qwen3-8b" in err and len(err.strip().splitlines()) == 1
    code, preset, _ = cli("plan", "qwen3-8b", "--kv-memory", "4GiB", "--max-seq-len", "4096", "--json")
    assert json.loads(out)["groups"] == json.loads(preset)["groups"]
    # the launch still names what the user asked for
    code, out, err = cli("plan", "Qwen/Qwen3-8B", "--kv-memory", "4GiB", "--emit", "vllm")
    assert out.startswith("vllm serve Qwen/Qwen3-8B ")


def test_a_pinned_revision_gets_no_stand_in(unreachable: list[tuple[str, int]]) -> None:
    """A preset says nothing about a given revision: the failure stands."""
    with pytest.raises(HubUnreachableError):
        resolve_model("Qwen/Qwen3-8B@abc123")


@pytest.mark.parametrize(
    ("repo_id", "preset"),
    [
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("google/gemma-3-27b-it", "gemma-3-27b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
        ("someorg/some-model", None),
        ("Qwen/Qwen3-8B-FP8", None),  # a quantized checkpoint is another model
    ],
)
def test_preset_for_hub_id(repo_id: str, preset: str | None) -> None:
    assert preset_for_hub_id(repo_id) == preset
