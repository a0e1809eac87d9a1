"""Every file the CLI writes goes through one writer (cli/files.py `write_outputs`):
a regular file is replaced whole, under a unique temporary name in its own
folder, keeping its mode; a device, a FIFO or a symbolic link is written through,
never replaced; a full disk leaves the old file as it was, with one line naming
the flag and the file. Each command that writes a file is tried on each kind of
target (the issue's `--emit-to /dev/null` turned /dev/null into a regular file)."""

from __future__ import annotations

import csv
import errno
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import files
from kvpool.errors import KvpoolError

Cli = Callable[..., tuple[int, str, str]]
FIT = ["fit", "llama-3.1-8b-instruct", "--gpu", "h100", "--engine", "vllm", "--emit-to"]
SIM = "simulate llama-3.1-8b-instruct --gpu h100 --kv-memory 4GiB --trace azure-conv --max-requests 20 --quiet"
GRID = "model: llama-3.1-8b-instruct\ngpu: h100\nkv_memory: 4GiB\ntrace: azure-conv\nmax_requests: 20\n"


def steps_csv(folder: Path) -> Path:
    """Six whole-step timings a calibrate run fits (a 1x machine, 2 ms floor)."""
    path = folder / "steps.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["decode_rows", "context", "prefill_tokens", "ms"])
        for rows, ctx, pre, ms in [(1, 100, 0, 9), (8, 2000, 0, 10), (64, 1000, 0, 14), (256, 500, 0, 25)]:
            w.writerow([rows, ctx, pre, ms])
        w.writerows([[0, 0, 2048, 60], [16, 800, 512, 30]])
    return path


# "command flag" -> the argv of a run that writes OUT (the flag's value)
WRITERS: dict[str, Callable[[Path, str], list[str]]] = {
    "fit --emit-to": lambda d, out: [*FIT, out],
    "calibrate --out": lambda d, out: [
        "calibrate",
        "llama-3.1-8b-instruct",
        "--gpu",
        "h100",
        "--steps",
        str(steps_csv(d)),
        "--out",
        out,
    ],  # fmt: skip
    "simulate --plot": lambda d, out: [*SIM.split(), "--plot", out],
    "sweep --plot": lambda d, out: [
        "sweep",
        str(grid(d)),
        "--out",
        str(d / "res"),
        "--serial",
        "--quiet",
        "--plot",
        out,
    ],
}
NEEDS_MATPLOTLIB = {"simulate --plot", "sweep --plot"}


def grid(folder: Path) -> Path:
    path = folder / "grid.yaml"
    path.write_text(GRID)
    return path


def writer_argv(name: str, folder: Path, out: str) -> list[str]:
    if name in NEEDS_MATPLOTLIB:
        pytest.importorskip("matplotlib")
    return WRITERS[name](folder, out)


def one_line(result: tuple[int, str, str], *words: str) -> str:
    code, _, err = result
    assert code == 2, f"exit {code}: {err!r}"
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    for word in words:
        assert word.lower() in err.lower(), f"{word!r} not in {err!r}"
    return err


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(files.TMP_SUFFIX)]


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_an_existing_file_is_replaced_whole_and_keeps_its_mode(cli: Cli, tmp_path: Path, name: str) -> None:
    """An executable launch script stays executable (the issue's outputs came out
    0600), and a user's OUT.tmp beside it is never touched (a fixed temporary name
    deleted it)."""
    out = tmp_path / "out.png" if "plot" in name else tmp_path / "out.json"
    out.write_text("old")
    out.chmod(0o750)
    mine = out.with_name(out.name + ".tmp")
    mine.write_text("the user's own file")
    code, _, err = cli(*writer_argv(name, tmp_path, str(out)))
    assert code == 0, err
    assert out.read_bytes() != b"old" and stat.S_IMODE(out.stat().st_mode) == 0o750
    assert mine.read_text() == "the user's own file"
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_new_file_gets_the_umask_mode(cli: Cli, tmp_path: Path, name: str) -> None:
    out = tmp_path / ("new.png" if "plot" in name else "new.json")
    old = os.umask(0o027)
    try:
        code, _, err = cli(*writer_argv(name, tmp_path, str(out)))
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # 0666 & ~027, as `open` would make it, not mkstemp's 0600


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_symbolic_link_is_written_through_not_replaced(cli: Cli, tmp_path: Path, name: str) -> None:
    target = tmp_path / "real" / ("t.png" if "plot" in name else "t.json")
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / ("link.png" if "plot" in name else "link.json")
    link.symlink_to(target)
    code, _, err = cli(*writer_argv(name, tmp_path, str(link)))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() != b"old"


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_dev_null_stays_a_device(cli: Cli, tmp_path: Path, name: str) -> None:
    """As root, `--emit-to /dev/null` replaced the machine's /dev/null with a file."""
    if name in NEEDS_MATPLOTLIB:
        pytest.skip("a plot's format comes from its suffix: /dev/null has none")
    code, _, err = cli(*writer_argv(name, tmp_path, "/dev/null"))
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("name", ["fit --emit-to", "calibrate --out"])
def test_dev_full_is_one_line_naming_flag_and_file(cli: Cli, tmp_path: Path, name: str) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    err = one_line(cli(*writer_argv(name, tmp_path, "/dev/full")), name.split()[1], "/dev/full", "no space")
    assert "written through" in err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_fifo_nobody_reads_is_refused_at_once(cli: Cli, tmp_path: Path, name: str) -> None:
    """`simulate --plot FIFO` waited forever for a reader."""
    fifo = tmp_path / ("p.png" if "plot" in name else "p.json")
    os.mkfifo(fifo)
    one_line(cli(*writer_argv(name, tmp_path, str(fifo))), name.split()[1], "no process reads")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_fifo_with_a_reader_is_written_through(cli: Cli, tmp_path: Path) -> None:
    fifo = tmp_path / "launch.sh"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    try:
        for _ in range(200):  # the reader opens the FIFO: then a writer finds it
            code, _, err = cli(*FIT, str(fifo))
            if code == 0 or "no process reads" not in err:
                break
            threading.Event().wait(0.01)
    finally:
        reader.join(timeout=30)
    assert code == 0, err
    assert got and got[0].startswith(b"vllm serve") and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize(
    ("make", "word"),
    [
        (lambda p: p.mkdir(), "folder"),
        (lambda p: socket.socket(socket.AF_UNIX).bind(str(p)), "socket"),
        (lambda p: (p.write_text("mine"), p.chmod(0o444)), "read-only"),
    ],
    ids=["folder", "socket", "read-only"],
)
def test_targets_that_are_not_files_to_replace_are_refused_before_the_work(
    cli: Cli, tmp_path: Path, make: Callable[[Path], Any], word: str
) -> None:
    target = tmp_path / "x.json"
    make(target)
    if word == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes read-only files")
    one_line(cli(*FIT, str(target)), "--emit-to", word)


def test_a_block_device_is_never_written(tmp_path: Path) -> None:
    """Root could otherwise write a launch script over a disk."""
    disks = [p for p in Path("/dev").iterdir() if p.exists() and stat.S_ISBLK(p.stat().st_mode)]
    if not disks:
        pytest.skip("no block device here")
    with pytest.raises(KvpoolError, match="block device"):
        files.check_output(disks[0])


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A disk that fills while a file is written: the data went out, fsync reports
    ENOSPC (where ext4's delayed allocation and NFS report it)."""

    def enospc(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", enospc)
    yield


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_full_disk_leaves_the_old_file_whole(cli: Cli, tmp_path: Path, name: str, full_disk: None) -> None:
    """`simulate --plot` on a full disk truncated an old plot to a partial PNG; the
    error named neither flag nor file."""
    out = tmp_path / ("out.png" if "plot" in name else "out.json")
    out.write_text("old")
    first = ("--out", str(tmp_path / "res.json")) if name.startswith("sweep") else (name.split()[1], str(out))
    one_line(cli(*writer_argv(name, tmp_path, str(out))), *first, "no space", "unchanged")
    assert out.read_text() == "old" and temporaries(tmp_path) == []


def test_a_full_disk_leaves_no_new_sweep_file(cli: Cli, tmp_path: Path, full_disk: None) -> None:
    """`sweep` on a full device exited 0 with partial files: now none of OUT.json,
    OUT.csv and the plot appears unless all do."""
    one_line(cli("sweep", str(grid(tmp_path)), "--out", str(tmp_path / "res"), "--serial", "--quiet"), "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (root only: skipped where it cannot be mounted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    except OSError:
        pytest.skip("no mount command")
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize("name", ["fit --emit-to", "simulate --plot"])
def test_a_really_full_tmpfs_leaves_the_old_file_whole(cli: Cli, tmp_path: Path, tiny_tmpfs: Path, name: str) -> None:
    out = tiny_tmpfs / ("old.png" if "plot" in name else "old.sh")
    out.write_text("old")
    out.chmod(0o755)
    with (tiny_tmpfs / "filler").open("wb", buffering=0) as f:  # fill the disk to the last block
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    one_line(cli(*writer_argv(name, tmp_path, str(out))), name.split()[1], str(out), "no space")
    assert out.read_text() == "old" and stat.S_IMODE(out.stat().st_mode) == 0o755
    assert temporaries(tiny_tmpfs) == []


def test_dev_stdout_into_a_pipe_is_written_through() -> None:
    """`kvpool fit ... --emit-to /dev/stdout | sh`: /dev/stdout is then a pipe."""
    done = subprocess.run([sys.executable, "-m", "kvpool", *FIT, "/dev/stdout"], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"vllm serve" in done.stdout
