"""Hugging Face ids through huggingface_hub (the `hub` extra): local cache first.

The cache is huggingface_hub's own (`models--org--name/refs/<revision>` holding a
commit sha, `snapshots/<sha>/<file>`), found as huggingface_hub finds it:
HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub. Both variables, and
HF_HUB_OFFLINE, are read on every call (huggingface_hub reads them once, at
import), so a caller that changes them is obeyed. Files are looked up with
huggingface_hub's `try_to_load_from_cache` and fetched with `hf_hub_download`,
never by re-implementing the layout. Only small files are ever downloaded:
config.json and `SMALL_FILES`, never weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from kvpool.errors import ModelSourceError

CONFIG = "config.json"

# Read beside config.json when present: how the checkpoint is quantized and
# stored (ModelOpt's hf_quant_config.json, the safetensors index), never weights.
SMALL_FILES = ("generation_config.json", "hf_quant_config.json", "model.safetensors.index.json")
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub/constants.py ENV_VARS_TRUE_VALUES
DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub/constants.py, overridden by HF_ENDPOINT
# huggingface_hub retries a connection error five times with backoff (~25 s); one
# connect of this many seconds says as much about a Hub that cannot be reached.
PROBE_TIMEOUT_S = 3.0


class HubUnreachableError(ModelSourceError):
    """The config is not in the cache and the Hub cannot be reached right now."""


def hub_cache_dir() -> Path:
    """The hub cache folder, as huggingface_hub/constants.py derives it."""
    env = os.environ
    where = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not where:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        where = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(where)))


def is_offline() -> bool:
    """HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE) is set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in TRUE


def hub_config(name: str, repo_id: str, revision: str) -> Path:
    """The config.json of `repo_id` at `revision` (a path in a cache snapshot
    folder, `snapshots/<commit sha>/config.json`), from the cache when it is
    there, else downloaded into it (unless offline). When not offline, the
    `SMALL_FILES` the cache knows nothing about are fetched too (at the same
    commit); one the repo lacks is remembered by huggingface_hub's cache and
    not asked for again."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise ModelSourceError(
            f"{name} looks like a Hugging Face id; reading one needs huggingface_hub: pip install 'kvpool[hub]'"
        ) from None
    cache = hub_cache_dir()
    offline = is_offline()
    cached = try_to_load_from_cache(repo_id, CONFIG, cache_dir=cache, revision=revision)
    if isinstance(cached, str):
        config = Path(cached)
    elif offline:
        if cached is not None:  # the cache remembers that the repo has no config.json
            raise ModelSourceError(f"{name}: the Hugging Face cache {cache} records no config.json at {revision}")
        raise ModelSourceError(
            f"{name} is no local path and its config.json is not in the Hugging Face cache {cache}; "
            f"HF_HUB_OFFLINE is set: unset it to download the config, or fetch it first "
            f"(hf download {repo_id} {CONFIG} --revision {revision})"
        )
    else:
        check_reachable(name, cache)
        config = Path(download(name, repo_id, CONFIG, revision, cache, optional=False) or "")
    commit = config.parent.name  # snapshots/<sha>/config.json
    if not offline:
        for small in SMALL_FILES:
            if try_to_load_from_cache(repo_id, small, cache_dir=cache, revision=commit) is None:
                download(name, repo_id, small, commit, cache, optional=True)
    return config


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def check_reachable(name: str, cache: Path) -> None:
    """One TCP connect to the Hub's endpoint, before huggingface_hub's retry loop:
    a machine without a connection fails in at most PROBE_TIMEOUT_S with one line
    (HubUnreachableError), not after ~25 s of retries."""
    import socket  # only a hub download needs it, not every start

    url = urlsplit(endpoint())
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise HubUnreachableError(
            f"{name} is not in the Hugging Face cache {cache} and the Hub ({endpoint()}) cannot be reached "
            f"({first_line(e)}); check the connection (or HF_ENDPOINT), or fetch the config first"
        ) from None


def download(name: str, repo_id: str, filename: str, revision: str, cache: Path, *, optional: bool) -> str | None:
    """`filename` of `repo_id` fetched into the cache by `hf_hub_download`; None
    when `optional` and the repo has no such file. Every failure is one
    `ModelSourceError` line saying what to do."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache)
    except EntryNotFoundError as e:
        if optional and not isinstance(e, LocalEntryNotFoundError):
            return None
        raise ModelSourceError(f"{name} {why_not_fetched(e, repo_id, filename, revision, cache)}") from None
    except (OSError, ValueError) as e:  # the Hub's errors are OSErrors (HTTP) or ValueErrors (offline)
        raise ModelSourceError(f"{name} {why_not_fetched(e, repo_id, filename, revision, cache)}") from None


def why_not_fetched(e: Exception, repo_id: str, filename: str, revision: str, cache: Path) -> str:
    """What `hf_hub_download`'s failure `e` means for the user, and what to do."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, GatedRepoError):
        return f"is gated: accept its terms on https://huggingface.co/{repo_id} and set HF_TOKEN to a token that may read it"
    if isinstance(e, RepositoryNotFoundError):
        return "is not a model on the Hugging Face Hub (a private one needs HF_TOKEN set to a token that may read it)"
    if isinstance(e, RevisionNotFoundError):
        return f"has no revision {revision!r} on the Hugging Face Hub"
    if isinstance(e, LocalEntryNotFoundError):
        return (
            f"is not in the Hugging Face cache {cache} and the Hub cannot be reached; "
            f"check the connection (or HF_ENDPOINT) and retry"
        )
    if isinstance(e, EntryNotFoundError):
        return f"has no {filename} at revision {revision}"
    if isinstance(e, OfflineModeIsEnabled):
        return f"is not in the Hugging Face cache {cache} and huggingface_hub is offline; unset HF_HUB_OFFLINE"
    status = e.response.status_code if isinstance(e, HfHubHTTPError) and e.response is not None else None
    if status in (401, 403):
        return f"cannot be read (HTTP {status}): set HF_TOKEN to a token that may read it"
    return f"cannot be fetched: {first_line(e)}"


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
