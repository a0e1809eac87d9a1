"""The files a command reads and writes, checked before any work: an input is a
regular file (a FIFO or a device would hang or never end); an output is written
by `write_outputs` alone, whole or not at all (a uniquely named temporary file in
the same folder, renamed over the target with the target's mode: a full disk or a
crash leaves the old file as it was), and a device, a FIFO or a symbolic link is
written through, never replaced."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

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


def check_folder(folder: Path) -> Path:
    """`folder` if every entry in it is a folder or a regular file (through links),
    else KvpoolError naming the first that is not: a model folder's FIFO or device
    (a config.json, a shard, a tokenizer file) would block the read of it forever."""
    for entry in sorted(folder.iterdir()):
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link: whoever reads it says so
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise KvpoolError(f"cannot read {entry}: not a regular file (a pipe or a device?)")
    return folder


def output_file(text: str) -> Path:
    """An argparse type: a path a file can be written to (`check_output`).
    Checked before the work, not after it."""
    try:
        path = check_output(text)
    except KvpoolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return path


def check_output(text: str | Path) -> Path:
    """`text` as a path `write_outputs` can write, or KvpoolError saying why not:
    a regular file (or a new one) in a folder where a file can be created (tried
    with a uniquely named file, removed at once: root passes `access()` even on
    /proc), a character device such as /dev/null, or a FIFO. A folder, a socket
    or a block device is refused: kvpool never writes over a disk."""
    if not str(text).strip():
        raise KvpoolError("expected a file name, got ''")
    path = expand(text)
    kind, real = destination(path)
    if kind == "file":
        if real.exists() and not os.access(real, os.W_OK):
            raise KvpoolError(f"cannot write {text}: the file is read-only")
        import tempfile  # loaded where a file is written, not on every start (it loads shutil, random, bz2)

        try:
            fd, probe = tempfile.mkstemp(prefix=f".{real.name}.", suffix=TMP_SUFFIX, dir=real.parent)
        except OSError as e:
            raise KvpoolError(
                f"cannot write {text}: folder {real.parent} does not take new files ({e.strerror})"
            ) from None
        os.close(fd)
        os.unlink(probe)
    elif kind == "fifo":
        _open_pipe(real)
    elif not os.access(real, os.W_OK):
        raise KvpoolError(f"cannot write {text}: permission denied")
    return path


# What a temporary file of `write_outputs` ends with (its name is unique: `tempfile.mkstemp`).
TMP_SUFFIX = ".kvpool-tmp"
Content = bytes | str | Callable[[BinaryIO], None]


def destination(path: Path) -> tuple[str, Path]:
    """How `path` is written, and the path written: ("file", the regular file a
    symbolic link leads to, or `path`; replaced whole), ("device", a character
    device) or ("fifo", a pipe: a named one, or /dev/stdout into `|`), both
    written through `path` itself. KvpoolError for anything else (a folder, a
    socket, a block device, a missing folder)."""
    try:
        mode: int | None = path.stat().st_mode  # through any link
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise KvpoolError(f"cannot write {path}: {e.strerror}") from None
    if mode is None or stat.S_ISREG(mode):
        real = path.resolve() if path.is_symlink() else path  # a link is written through, never replaced
        if not real.parent.is_dir():
            raise KvpoolError(f"cannot write {path}: no folder {real.parent}")
        return "file", real
    if stat.S_ISCHR(mode):
        return "device", path
    if stat.S_ISFIFO(mode):
        return "fifo", path
    what = "a folder; give a file name" if stat.S_ISDIR(mode) else "a socket or a block device, not a file"
    raise KvpoolError(f"cannot write {path}: it is {what}")


# Pipes opened by `check_output` (path -> fd), kept open until written: closing
# one would tell its reader the output has ended before it was written.
_PIPES: dict[Path, int] = {}


def _open_pipe(path: Path) -> int:
    """A blocking write descriptor on the pipe `path`, opened once (O_NONBLOCK
    first: with no reader the open fails at once instead of waiting for one)."""
    if path in _PIPES:
        return _PIPES[path]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise KvpoolError(f"cannot write {path}: a named pipe that no process reads") from None
        raise KvpoolError(f"cannot write {path}: {e.strerror}") from None
    os.set_blocking(fd, True)
    _PIPES[path] = fd
    return fd


def write_output(target: str | Path, content: Content, flag: str) -> Path:
    """`write_outputs` of one file; returns the path as given (`~` expanded)."""
    write_outputs([(target, content, flag)])
    return expand(target)


def write_outputs(outputs: Sequence[tuple[str | Path, Content, str]]) -> None:
    """Write each (target, content, flag): `content` is bytes, text (UTF-8), or a
    function that writes to a binary file. A regular file is written whole into a
    uniquely named temporary file beside it (the old file's mode and owner kept,
    a new one gets the umask's mode) and renamed over it once every output is
    written: a full disk or a crash leaves the old files as they were and no
    temporary behind. A character device (/dev/null, /dev/stdout) or a FIFO with a
    reader is written through, never replaced; a FIFO nobody reads is refused.
    Raises KvpoolError naming the flag and the file."""
    staged: list[tuple[Path, Path]] = []
    through: list[tuple[str, Path, Content, str, str | Path]] = []
    try:
        for target, content, flag in outputs:
            with _naming(flag, target, "any file that was there is unchanged"):
                kind, real = destination(expand(target))
                if kind == "file":
                    staged.append((_staged(real, content), real))
                else:
                    through.append((kind, real, content, flag, target))
        for tmp, real in staged:
            os.replace(tmp, real)
        staged.clear()
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for kind, real, content, flag, target in through:
        with _naming(flag, target, f"a {kind} is written through, so part of it may have been"):
            _write_through(kind, real, content)


@contextlib.contextmanager
def _naming(flag: str, target: str | Path, after: str) -> Iterator[None]:
    """An OSError or KvpoolError while writing `target` as one line naming `flag`
    and the file, and what became of it (`after`)."""
    try:
        yield
    except KvpoolError as e:
        raise KvpoolError(f"{flag}: {e}") from None
    except OSError as e:
        raise KvpoolError(f"{flag} {target}: cannot write it ({e.strerror or e}); {after}") from None


def _staged(real: Path, content: Content) -> Path:
    """`content` written whole to a new temporary file beside `real`, with the mode
    (and, as root, the owner) `real` has, or the umask's for a new file."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix=f".{real.name}.", suffix=TMP_SUFFIX, dir=real.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            _put(f, content)
            f.flush()
            os.fsync(f.fileno())  # a disk that fills is reported here, not after the rename
            try:
                old = real.stat()
            except FileNotFoundError:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            else:
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
                if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_through(kind: str, path: Path, content: Content) -> None:
    """Write `content` into a device or a pipe as it is."""
    if kind == "fifo":
        _open_pipe(path)
        fd = _PIPES.pop(path)
    else:
        fd = os.open(path, os.O_WRONLY)
    with os.fdopen(fd, "wb") as f:
        _put(f, content)


def _put(f: BinaryIO, content: Content) -> None:
    if isinstance(content, str):
        f.write(content.encode())
    elif isinstance(content, bytes):
        f.write(content)
    else:
        content(f)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
