"""`kvpool` command line: one module per subcommand, registered here.

Exit codes: 0 success, 2 user error (one line on stderr), 1 internal failure.
Set KVPOOL_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import importlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from kvpool.errors import KvpoolError

# Subcommand modules, each with `register(subparsers)`; imported lazily so that
# `kvpool inspect` never pays for torch.
COMMANDS = {
    "inspect": "kvpool.cli.inspect_cmd",
    "models": "kvpool.cli.presets_cmd",
    "gpus": "kvpool.cli.presets_cmd",
    "generate": "kvpool.cli.generate_cmd",
    "plan": "kvpool.cli.plan_cmd",
    "fit": "kvpool.cli.fit_cmd",
    "serve": "kvpool.cli.serve_cmd",
    "simulate": "kvpool.cli.simulate_cmd",
    "calibrate": "kvpool.cli.calibrate_cmd",
    "sweep": "kvpool.cli.sweep_cmd",
    "warmup": "kvpool.cli.warmup_cmd",
}


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse drops a "--" value (`--tp=--`) and stores [] for a one-value
        # option, which then fails deep inside as a TypeError: read it as the text
        # it is, so that the option's own type refuses it, naming the option.
        if arg_strings == ["--"] and action.nargs is None:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or only of `command` when it names one:
    a run then imports its own module alone (`kvpool simulate` needs no
    server, sweep or inspector; about 40 ms of each start)."""
    parser = Parser(prog="kvpool", description="Plan and manage the paged KV cache of LLM serving engines.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for module_name in dict.fromkeys(modules):
        importlib.import_module(module_name).register(sub)
    return parser


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """`--opt -5GiB` as `--opt=-5GiB`: argparse takes a value that starts with
    '-' and is not a plain number for an option and answers "expected one
    argument"; joined, the option's own check says what is wrong with it."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"-[0-9.]", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run `kvpool ARGV...` and return its exit code (a usage error, --help and
    --version too: argparse's exit is caught here, so a caller in the same
    process gets the code back as for any other error). Without `argv`, the
    process's own command line, and the process ends with the command. Sets
    `OPENBLAS_NUM_THREADS=1` in `os.environ` unless it is set (below), so
    processes started after it inherit it."""
    in_process = argv is not None  # a caller's own list, not this process's command line
    argv = sys.argv[1:] if argv is None else list(argv)
    refused = unreadable(argv)
    if refused:
        print(f"kvpool: error: {refused}", file=sys.stderr)
        return 2
    # NumPy's OpenBLAS starts a worker thread per extra core as it loads, and
    # each spins on its core for a while waiting for work (40-60 ms of CPU
    # apiece, measured): the commands' arrays are far too small for threaded
    # BLAS, so that spin is all the threads would add. Set before the
    # subcommand's modules load NumPy (`kvpool` itself loads none); a user's own
    # setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with collector_paused():
        parser = build_parser(argv[0] if argv else None)  # the subcommand's modules load here
        # What they made lives as long as the command: out of the collector's
        # generations (frozen before the collector resumes, or its first pass
        # walks it all), so that no pass of the run walks it again, nor the
        # interpreter's last one at exit (about 7 ms, measured). Frozen objects
        # are never freed: a caller in the same process (tests) gets its
        # collector back whole.
        gc.freeze()
    try:
        return run_command(parser, argv)
    finally:
        if in_process:
            gc.unfreeze()


def run_command(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse `argv` and run its subcommand: its exit code (argparse's exit caught)."""
    try:
        args = parser.parse_args(join_negative_values(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2 if e.code else 0
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a full disk or closed pipe shows here, not in the interpreter's exit
        return code
    except Exception as e:
        return failed(args.command, e)
    except KeyboardInterrupt:
        print("kvpool: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block without the cyclic garbage collector. Loading a
    subcommand's modules makes tens of thousands of objects that live as long
    as the process, and next to no garbage: the collector's passes while they
    load (about 60; with the freeze after them, 5 % of a 20-request `kvpool
    simulate`'s CPU, measured) find nothing to free."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def unreadable(argv: Sequence[str]) -> str | None:
    """Why the command cannot run at all, before its options are read: nowhere to
    answer (stdout closed: `kvpool ... >&-`), or a NUL byte (no shell passes one;
    every path and name reader would fail on it differently)."""
    if sys.stdout is None:
        return "stdout is closed; redirect it to a file or /dev/null"
    nul = next((a for a in argv if "\x00" in a), None)
    return None if nul is None else f"argument {nul.split('=')[0]!r} holds a NUL byte"


def failed(command: str, e: Exception) -> int:
    """The exit code of a command that raised `e`, with its one line on stderr."""
    if isinstance(e, KvpoolError):
        print(f"kvpool {command}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    if isinstance(e, BrokenPipeError):
        # the reader left (`kvpool ... | head`): not an error. Point stdout at
        # devnull so that the interpreter's final flush does not fail again.
        _silence_stdout()
        return 0
    if isinstance(e, OSError):  # the machine's, not kvpool's: a full disk, a device gone
        where = f" ({e.filename})" if e.filename else " (writing standard output)" if e.errno in WRITE_ERRORS else ""
        _silence_stdout()
        print(f"kvpool {command}: error: {one_line(f'{e.strerror or e}{where}')}", file=sys.stderr)
        return 2
    if os.environ.get("KVPOOL_DEBUG"):  # an internal failure: say so, keep the traceback opt-in
        raise e
    print(
        f"kvpool {command}: internal error: {type(e).__name__}: {str(e).strip().partition(chr(10))[0]} "
        "(set KVPOOL_DEBUG=1 for a traceback)",
        file=sys.stderr,
    )
    return 1


# What a write without a file name fails with: stdout's (files kvpool writes name their flag, cli/files.py).
WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def one_line(message: str) -> str:
    """`message` on one line: a library's message may quote a multi-line source
    (a YAML error shows the offending lines), and the promise is one line."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def _silence_stdout() -> None:
    """Point stdout at devnull so that the interpreter's final flush of what is
    still buffered does not fail a second time."""
    with contextlib.suppress(OSError, ValueError):  # stdout may not be a real file
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
