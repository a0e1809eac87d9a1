"""Shared test factories."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI replays the same examples every run (a red CI then always means a real
# change); local runs explore new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# `pip install -e .[dev]` alone runs a green core suite: modules that need an
# optional extra at import time are not collected without it (the others call
# pytest.importorskip where they need one).
collect_ignore_glob = []
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
    collect_ignore_glob += ["test_engine_*.py", "engine_helpers.py"]


# What `make test-core` leaves out (`-m "not slow and not outside"`; `make test` runs it all):
# tests that need what `make setup` does not install (the engines' side venvs: every module
# that reads KVPOOL_ENGINES_REQUIRED; Chromium) or that run the reference engine's torch
# models, and whole studies (marked slow where they are).
OUTSIDE = ("test_serve_browser.py", "test_engine_")


@functools.cache
def outside(path: Path) -> bool:
    return path.name.startswith(OUTSIDE) or "KVPOOL_ENGINES_REQUIRED" in path.read_text(encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "outside: needs what make setup does not install, or runs torch models (conftest OUTSIDE)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if outside(item.path):
            item.add_marker(pytest.mark.outside)


def attention_config(**overrides: Any) -> dict[str, Any]:
    """A small Llama-like config dict; override any field."""
    config: dict[str, Any] = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run `kvpool ARGS...` in-process: returns (exit code, stdout, stderr)."""
    from kvpool.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse usage errors
            code = int(e.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
