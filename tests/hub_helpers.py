"""A Hugging Face hub cache laid out on disk the way huggingface_hub writes it
(file_download.py: `models--org--name/blobs/<hash>`, `snapshots/<sha>/<file>`
symlinks to the blobs, `refs/<revision>` holding the commit sha), so hub ids can
be resolved in tests with no network."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
GEMMA3_ID = "google/gemma-3-27b-it"
# the real published config (tests/data/configs/SOURCES.md)
GEMMA3_CONFIG = DATA / "configs" / "gemma-3-27b-it.json"
GEMMA3_SHA = hashlib.sha1(b"kvpool test snapshot of google/gemma-3-27b-it").hexdigest()
MODELOPT_ID = "nvidia/Llama-3.1-70B-Instruct-FP8"
MODELOPT_DIR = DATA / "modelopt" / "Llama-3.1-70B-Instruct-FP8"


def repo_folder(cache: Path, repo_id: str) -> Path:
    """cache/models--org--name (huggingface_hub `repo_folder_name`)."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def lay_out_snapshot(
    cache: Path,
    repo_id: str,
    files: Mapping[str, Path | bytes],
    *,
    commit: str,
    refs: Sequence[str] = ("main",),
) -> Path:
    """Write `files` (name -> a file to copy, or its bytes) as the snapshot of
    `commit` of `repo_id` under `cache`, each one a symlink to its blob, and make
    every name in `refs` point at `commit`. Returns the snapshot folder."""
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes no newline
    return snapshot


def offline_hub(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """Point huggingface_hub's cache variables at `cache` and go offline (cache
    only), for this test alone."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)


def gemma3_hub(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    """An offline hub cache under `root` holding google/gemma-3-27b-it's real
    config.json at GEMMA3_SHA (refs/main); returns the snapshot folder."""
    cache = root / "hub"
    snapshot = lay_out_snapshot(cache, GEMMA3_ID, {"config.json": GEMMA3_CONFIG}, commit=GEMMA3_SHA)
    offline_hub(monkeypatch, cache)
    return snapshot


def http_error(cls: type[Exception], status: int) -> Exception:
    """One of huggingface_hub's HTTP errors (GatedRepoError, ...) as it raises
    them, with a `status` response, built without any request being sent."""
    import httpx2

    response = httpx2.Response(status, request=httpx2.Request("HEAD", "https://huggingface.co/x/y/resolve/main/a"))
    return cls(f"{status} Client Error", response=response)  # type: ignore[call-arg]
