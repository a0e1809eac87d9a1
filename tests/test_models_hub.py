"""The online path of Hugging Face ids (kvpool.models.hub), with
huggingface_hub's hf_hub_download replaced by a stand-in: what is downloaded
(config.json, then the small files at the same commit, never weights) and how
every Hub failure becomes one line naming the id and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hub_helpers import GEMMA3_CONFIG, GEMMA3_ID, GEMMA3_SHA, http_error, lay_out_snapshot
from kvpool.models import resolve_model
from kvpool.models.hub import SMALL_FILES

hub_errors = pytest.importorskip("huggingface_hub.errors")


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Not offline, an empty cache in tmp_path; the test installs its own
    hf_hub_download (the default refuses)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError(f"unexpected download {args}")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)
    # the Hub "answers" the reachability probe; the stand-ins above decide the rest
    monkeypatch.setattr("kvpool.models.hub.check_reachable", lambda name, cache: None)
    return tmp_path / "hub"


def test_a_miss_downloads_config_json_then_the_small_files_at_its_commit(
    online: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str | None]] = []

    def fake_download(repo_id: str, filename: str, *, revision: str | None = None, cache_dir: Path) -> str:
        calls.append((filename, revision))
        assert repo_id == GEMMA3_ID and Path(cache_dir) == online
        if filename != "config.json":
            raise hub_errors.EntryNotFoundError(f"{filename} not in repo")  # the repo lacks it
        files = {"config.json": GEMMA3_CONFIG}
        return str(lay_out_snapshot(online, repo_id, files, commit=GEMMA3_SHA) / filename)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    found = resolve_model(GEMMA3_ID)
    assert (found.kind, found.commit, found.revision) == ("hub", GEMMA3_SHA, "main")
    assert calls == [("config.json", "main"), *((name, GEMMA3_SHA) for name in SMALL_FILES)]
    assert not any(name.endswith((".safetensors", ".bin", ".gguf")) for name, _ in calls)


def test_a_cached_config_is_not_downloaded_again(online: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = {name: b"{}" for name in SMALL_FILES}
    lay_out_snapshot(online, GEMMA3_ID, {"config.json": GEMMA3_CONFIG, **small}, commit=GEMMA3_SHA)
    assert resolve_model(GEMMA3_ID).commit == GEMMA3_SHA  # the refusing stand-in was never called


@pytest.mark.parametrize(
    ("error", "needles"),
    [
        (lambda: http_error(hub_errors.GatedRepoError, 401), ("gated", "HF_TOKEN")),
        (lambda: http_error(hub_errors.RepositoryNotFoundError, 404), ("not a model on the Hugging Face Hub",)),
        (lambda: http_error(hub_errors.RevisionNotFoundError, 404), ("no revision 'main'",)),
        (lambda: http_error(hub_errors.HfHubHTTPError, 401), ("HTTP 401", "HF_TOKEN")),
        (lambda: hub_errors.LocalEntryNotFoundError("no connection"), ("cannot be reached",)),
        (lambda: hub_errors.EntryNotFoundError("404"), ("has no config.json",)),
        (lambda: hub_errors.OfflineModeIsEnabled("offline"), ("unset HF_HUB_OFFLINE",)),
    ],
)
def test_hub_failures_are_one_line_exit_2(
    online: Path, monkeypatch: pytest.MonkeyPatch, cli: Any, error: Any, needles: tuple[str, ...]
) -> None:
    def failing(*args: Any, **kwargs: Any) -> str:
        raise error()

    monkeypatch.setattr("huggingface_hub.hf_hub_download", failing)
    code, out, err = cli("inspect", GEMMA3_ID)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert GEMMA3_ID in err and all(n in err for n in needles), err
