"""Exact weights of a Hugging Face id whose safetensors are not in the local cache:
the headers only, read remotely through huggingface_hub's
`get_safetensors_metadata` (HTTP range requests for the 8-byte length and the JSON
header of each shard, never the tensor data), then cached as JSON under
kvpool's cache folder (`$KVPOOL_CACHE`, else `$XDG_CACHE_HOME/kvpool`, else
~/.cache/kvpool), one file per repository commit, so the Hub is asked once.

Offline (HF_HUB_OFFLINE), unreachable, or a repository without safetensors:
`RemoteHeadersError`, and the caller counts the weights from config.json instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvpool import jsonsafe
from kvpool.errors import KvpoolError
from kvpool.models.hub import check_reachable, hub_cache_dir, is_offline
from kvpool.models.safetensors_headers import TensorHeader


class RemoteHeadersError(KvpoolError):
    """The remote headers cannot be read now (offline, unreachable, no safetensors)."""


def cache_dir() -> Path:
    env = os.environ
    root = env.get("KVPOOL_CACHE") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "kvpool")
    return Path(os.path.expanduser(root)) / "safetensors-headers"


def hub_snapshot(folder: Path) -> tuple[str, str] | None:
    """(repo_id, commit) of a hub-cache snapshot folder
    (`models--org--name/snapshots/<commit>`), else None."""
    repo = folder.parent.parent.name
    if folder.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    org, _, name = repo.removeprefix("models--").partition("--")
    return (f"{org}/{name}", folder.name) if org and name else None


def remote_tensors(repo_id: str, commit: str) -> list[TensorHeader]:
    """Every tensor of `repo_id` at `commit` as its safetensors headers state it
    (module docstring). Raises RemoteHeadersError when they cannot be read now."""
    cached = cache_dir() / f"{repo_id.replace('/', '--')}@{commit}.json"
    known = _cached_tensors(cached)
    if known is not None:
        return known
    if is_offline():
        raise RemoteHeadersError(f"{repo_id}: HF_HUB_OFFLINE is set and its safetensors headers are not cached")
    try:
        from huggingface_hub import get_safetensors_metadata
    except ImportError:
        raise RemoteHeadersError("reading remote headers needs huggingface_hub") from None
    try:
        check_reachable(repo_id, hub_cache_dir())
    except KvpoolError as e:
        raise RemoteHeadersError(str(e)) from None
    try:
        meta = get_safetensors_metadata(repo_id, revision=commit)
    except Exception as e:  # any Hub failure: the caller falls back to config.json
        raise RemoteHeadersError(f"{repo_id}: safetensors headers unreadable ({type(e).__name__}: {e})") from None
    tensors = [
        TensorHeader(
            name, str(info.dtype), tuple(int(d) for d in info.shape), info.data_offsets[1] - info.data_offsets[0]
        )
        for file in meta.files_metadata.values()
        for name, info in file.tensors.items()
    ]
    _cache_tensors(cached, tensors)
    return tensors


def _cached_tensors(cached: Path) -> list[TensorHeader] | None:
    """The tensors cached in `cached`, or None (none there, or a damaged file, removed)."""
    if not cached.is_file():
        return None
    try:
        rows = jsonsafe.loads(cached.read_bytes())
        return [TensorHeader(str(r[0]), str(r[1]), tuple(int(d) for d in r[2]), int(r[3])) for r in rows]
    except (OSError, ValueError, TypeError, IndexError, KeyError):
        cached.unlink(missing_ok=True)  # our own cache, damaged: read the headers again
        return None


def _cache_tensors(cached: Path, tensors: list[TensorHeader]) -> None:
    """Write `tensors` to `cached` whole (a unique temporary renamed: processes share the cache)."""
    import tempfile  # loaded where the cache is written, not on every start

    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{cached.name}.", dir=cached.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps([[t.name, t.dtype, list(t.shape), t.nbytes] for t in tensors]))
        os.replace(tmp, cached)
    finally:
        Path(tmp).unlink(missing_ok=True)
