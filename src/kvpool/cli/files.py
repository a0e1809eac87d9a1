"""The files a command reads and writes, checked before any work: an input is a
regular file (a FIFO or a device would hang or never end), an output goes to a
folder that exists, and is written whole or not at all (a temporary file in the
same folder, renamed over the target: a full disk or a crash leaves no
half-written or empty file behind)."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kvpool.errors import KvpoolError

# An input file past this is not a grid or a measurement table someone wrote.
MAX_INPUT_BYTES = 64 * 2**20


def input_file(text: str) -> Path:
    """An argparse type: a path to a regular file of at most 64 MiB (`~` expanded)."""
    try:
        path = check_input(text)
    except KvpoolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


def grid_file(text: str) -> Path:
    """`input_file` for a sweep grid (its errors say "grid")."""
    try:
        path = check_input(text, "grid ")
    except KvpoolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


def check_input(text: str | Path, what: str = "") -> Path:
    """`text` as a readable regular file, or KvpoolError saying why not."""
    path = expand(text)
    try:
        info = path.stat()
    except OSError as e:
        raise KvpoolError(f"cannot read {what}{text}: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe or a device?)"
        raise KvpoolError(f"cannot read {what}{text}: {kind}")
    if info.st_size > MAX_INPUT_BYTES:
        raise KvpoolError(f"{text} is {info.st_size:,} bytes, more than {MAX_INPUT_BYTES:,}; not an input kvpool reads")
    return path


def output_file(text: str) -> Path:
    """An argparse type: a path a file can be written to (its folder exists and is
    writable, the path is not a folder). Checked before the work, not after it."""
    try:
        path = check_output(text)
    except KvpoolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


def check_output(text: str | Path) -> Path:
    """`text` as a writable file path, or KvpoolError saying why not."""
    if not str(text).strip():
        raise KvpoolError("expected a file name, got ''")
    path = expand(text)
    if path.is_dir():
        raise KvpoolError(f"cannot write {text}: it is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise KvpoolError(f"cannot write {text}: no folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KvpoolError(f"cannot write {text}: folder {folder} is not writable")
    return path


def expand(text: str | Path) -> Path:
    """`text` with a leading `~` expanded; KvpoolError when there is no home to expand it to."""
    path = Path(text)
    if not str(text).startswith("~"):
        return path
    try:
        return path.expanduser()
    except RuntimeError:  # no HOME and no password entry for this user
        raise KvpoolError(
            f"cannot expand '~' in {text}: no home directory (HOME is not set); give the full path"
        ) from None


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """A temporary path beside `target` with its suffix (matplotlib picks the
    format by it) to write to; renamed over `target` when the block ends
    without error, removed when it raises."""
    target = Path(target)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=target.suffix, dir=target.parent or ".")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
