"""`resolve_model`: a MODEL argument -> `ModelSource`, the config.json it names
and the folder that config lies in (sidecar files such as hf_quant_config.json
are read from that folder).

A MODEL is, in this order: a bundled preset name (`kvpool models`); an existing
path (a config.json or its folder); a Hugging Face id `org/name[@revision]`
(huggingface_hub's local cache first, see `kvpool.models.hub`). Nothing else is
guessed at: a string that is none of the three is refused naming the three forms.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvpool import presets
from kvpool.errors import KvpoolError, ModelSourceError, UnknownPresetError
from kvpool.models.hub import CONFIG, HubUnreachableError, hub_config

FORMS = (
    "MODEL is a preset name (kvpool models), a path to a config.json or its folder, "
    "or a Hugging Face id org/name[@revision]"
)
# huggingface_hub's repo-id rule (utils/_validators.py `validate_repo_id`): letters,
# digits, '-', '_', '.', not starting or ending with '-' or '.', no '--' or '..',
# each part at most 96 characters. A revision is a branch, tag or commit sha;
# branches may hold '/' (refs/pr/1).
PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
HUB_ID = re.compile(rf"(?P<repo>{PART}/{PART})(?:@(?P<revision>[\w.-]+(?:/[\w.-]+)*))?", re.ASCII)
DEFAULT_REVISION = "main"

Kind = Literal["preset", "path", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's config comes from.

    `name` is the MODEL string as given. `config_path` is the config.json read
    (the bundled file for a preset); `folder` the folder it lies in, where sidecar
    files are looked for (None for a preset). For a hub id: `repo_id`, the
    `revision` asked for (default main) and the `commit` sha of the cache
    snapshot the files were read from.
    """

    kind: Kind
    name: str
    config_path: Path
    folder: Path | None = None
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    fallback: str | None = None  # why a preset stands in for the hub id asked for

    def describe(self) -> str:
        """One line for people: `preset qwen3-8b`, `path /x/config.json`,
        `hub google/gemma-3-27b-it@main (commit 0123456789ab, /cache/...)`."""
        if self.kind == "preset":
            return f"preset {self.name.lower()}"
        if self.kind == "path":
            return f"path {self.config_path}"
        return f"hub {self.repo_id}@{self.revision} (commit {(self.commit or '?')[:12]}, {self.config_path})"

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (paths as strings, absent ones null)."""
        return {
            "kind": self.kind,
            "name": self.name,
            "config_path": str(self.config_path),
            "folder": None if self.folder is None else str(self.folder),
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            **({"fallback": self.fallback} if self.fallback else {}),
        }


def hub_source(model: str, repo_id: str, revision: str | None) -> ModelSource:
    """A Hugging Face id's config in the hub cache (fetched when missing); when the Hub
    cannot be reached, the bundled preset of the same architecture, said why (not for
    a pinned revision: that is a commit no preset stands for)."""
    try:
        config = hub_config(model, repo_id, revision or DEFAULT_REVISION)
    except HubUnreachableError as e:
        preset = preset_for_hub_id(repo_id)
        if preset is None or revision:
            raise
        why = (
            f"{e}; using the bundled preset {preset}, which describes the same architecture "
            f"(give MODEL {preset} to plan it directly)"
        )
        return ModelSource("preset", preset, presets.DATA / "models" / f"{preset}.json", fallback=why)
    # snapshots/<commit sha>/config.json: the folder holds the commit's other files
    return ModelSource("hub", model, config, config.parent, repo_id, revision or DEFAULT_REVISION, config.parent.name)


def resolve_model(model: str | os.PathLike[str]) -> ModelSource:
    """Where `model` (a MODEL argument) comes from.

    A `Path` (any `os.PathLike`) is always a path. A string is a preset name
    (case-insensitive), else an existing path, else a path when it looks like
    one (ends in .json, starts with /, . or ~; reading it then says it does not
    exist), else a Hugging Face id `org/name[@revision]`. Only a hub id has side
    effects: the hub cache is read, and when not offline (HF_HUB_OFFLINE) a
    config.json missing from it, and the small files of
    `kvpool.models.hub.SMALL_FILES` it knows nothing of, are downloaded into it. Raises `ModelSourceError` (or `UnknownPresetError` for a bare word
    that is no preset) naming what to do instead.
    """
    if not isinstance(model, str):
        return path_source(Path(model), os.fspath(model))
    if not model.strip():
        raise ModelSourceError(f"MODEL is empty; {FORMS}")
    if model.lower() in presets.model_names():
        return ModelSource("preset", model, presets.DATA / "models" / f"{model.lower()}.json")
    path = expanded(model)
    if path.exists() or model.endswith(".json") or model.startswith(("/", ".", "~")):
        return path_source(path, model)
    match = HUB_ID.fullmatch(model)
    if match and "--" not in match["repo"] and ".." not in match["repo"]:
        return hub_source(model, match["repo"], match["revision"])
    raise not_a_model(model)


def expanded(model: str) -> Path:
    """MODEL as a path, `~` expanded; ModelSourceError when there is no home to expand it to."""
    try:
        return Path(model).expanduser()
    except RuntimeError:  # `~` with no HOME and no password entry to find the home in
        raise ModelSourceError(f"cannot expand '~' in {model!r}: no home directory; give the full path") from None


def not_a_model(model: str) -> KvpoolError:
    """The error for a MODEL that is none of the forms: a bare word is read as a
    preset's misspelling (UnknownPresetError, with the nearest names)."""
    if "/" not in model and "\\" not in model and "@" not in model:
        try:
            presets.load_model_config(model)
        except UnknownPresetError as e:
            return UnknownPresetError(e.kind, e.name, e.suggestions, e.available, also=f" ({FORMS})")
    return ModelSourceError(f"{model!r} is not a preset, an existing path or a well-formed Hugging Face id; {FORMS}")


def preset_for_hub_id(repo_id: str) -> str | None:
    """The bundled preset a hub id names, matched on the repository's name without
    its instruct suffix (`Qwen/Qwen3-8B` -> qwen3-8b, `google/gemma-3-27b-it` ->
    gemma-3-27b, `meta-llama/Llama-3.1-70B-Instruct` -> llama-3.1-70b); None if none."""
    name = repo_id.split("/", 1)[1].lower()
    names = presets.model_names()
    for candidate in (name, name.removesuffix("-instruct"), name.removesuffix("-it")):
        if candidate in names:
            return candidate
    return None


def path_source(path: Path, name: str) -> ModelSource:
    """A local config.json, or the config.json of a folder (existing or not: the
    reader says which file is missing)."""
    config = path / CONFIG if path.is_dir() else path
    return ModelSource("path", name, config, config.parent)


def weights_folder(model: str) -> Path:
    """The local folder holding the weights of `model`, a Hugging Face id: its
    cache snapshot folder (see `resolve_model` for the side effects). Raises
    `ModelSourceError` when `model` is no hub id or the cache holds no
    *.safetensors for it: kvpool never downloads weights."""
    found = resolve_model(model)
    if found.kind != "hub" or found.folder is None:
        raise ModelSourceError(f"{model}: expected a model folder, a .gguf file or a Hugging Face id")
    if not any(found.folder.glob("*.safetensors")):
        raise ModelSourceError(
            f"{model}: the Hugging Face cache holds no *.safetensors for it ({found.folder}) and kvpool "
            f"downloads no weights; fetch them first: hf download {found.repo_id} --revision {found.revision}"
        )
    return found.folder
