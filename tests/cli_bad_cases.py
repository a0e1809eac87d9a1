"""Bad values for every flag of every `kvpool` subcommand, generated from the
argparse definitions themselves: a flag's kind (a count, a size, a fraction, a
list, a path, ...) is read from its type, metavar and choices, and `BAD` says
what is wrong for that kind. A new flag is covered without a new row, or fails
`test_every_flag_has_a_kind` (tests/test_cli_generated_bad_input.py).

Each case is one valid command line (`BASE`) with one flag given a bad value;
the command must answer exit 2 with one stderr line that names the flag."""

from __future__ import annotations

import argparse
import os
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvpool.cli.main import build_parser

HUGE = str(10**30)  # past int64 and every sane count
LONG_DIGITS = "9" * 5000  # past Python's int-string limit (4300 digits)

# A valid command line per subcommand: every case changes one flag of it.
# `{tmp}` is the test's own folder (output files must not appear there).
SIM = (
    "simulate llama-3.1-8b-instruct --gpu h100 --kv-memory 4GiB --max-seq-len 4096 "
    "--trace azure-conv --max-requests 40 --quiet"
)
BASE: dict[str, str] = {
    "inspect": "inspect llama-3.1-8b-instruct",
    "models": "models",
    "gpus": "gpus",
    "generate": "generate --tiny llama --prompt-ids 1,2,3 --max-new-tokens 2",
    "plan": "plan llama-3.1-8b-instruct --kv-memory 16GiB",
    "fit": "fit llama-3.1-8b-instruct --gpu h100",
    "serve": "serve",
    "simulate": SIM,
    "calibrate": "calibrate llama-3.1-8b-instruct --gpu h100 --steps {tmp}/steps.csv -o {tmp}/out.json",
    "sweep": "sweep {tmp}/grid.yaml --out {tmp}/sweep --serial --quiet",
    "warmup": "warmup llama-3.1-8b-instruct --kv-memory 16GiB",
}
# Flags whose bad values are only read with another flag: that flag is added
# first (the whole-GPU parts mean something with --gpu and no --kv-memory).
NEEDS: dict[str, str] = {
    "--non-kv-memory": "--gpu h100",
    "--memory-fraction": "--gpu h100",
    "--weights-memory": "--gpu h100",
    "--activation-memory": "--gpu h100",
    "--cuda-graph-memory": "--gpu h100",
    "--reserved-memory": "--gpu h100",
}
# Commands whose --kv-memory is dropped when a --gpu-only budget flag is tested.
GPU_ONLY = {"--non-kv-memory", "--memory-fraction", "--weights-memory", "--activation-memory"}
GPU_ONLY |= {"--cuda-graph-memory", "--reserved-memory"}

COUNT = ["-1", "abc", "1.5", "", " ", "1e3", "0x10", "nan", "inf", HUGE, LONG_DIGITS, "--"]
BAD: dict[str, list[str]] = {
    "count": ["0", *COUNT],  # a positive integer
    "count0": COUNT,  # a non-negative integer
    "tokens": ["0", *COUNT],  # a positive integer or 'none'
    "int": ["abc", "1.5", "", "nan", HUGE, LONG_DIGITS],
    "speculate": ["-1", "abc", "1.5", "", HUGE, LONG_DIGITS],
    "seed": ["-1", "abc", "1.5", "", HUGE, LONG_DIGITS],
    "port": ["-1", "65536", "abc", "", HUGE],
    "fraction": ["0", "-0.5", "1.5", "nan", "inf", "-inf", "abc", "", "1e400"],
    "positive_float": ["0", "-1", "nan", "inf", "abc", "", "1e400"],
    # 1000TiB: no machine holds it (the books of its pages ran out of memory); 2**60 + 1 bytes: past 1 EiB, exactly
    "size": [
        "-1GiB",
        "0",
        "lots",
        "12XB",
        "",
        " ",
        "1e400",
        "2000000TiB",
        "1000TiB",
        "1152921504606846977",
        "1e" + "4" * 60,
    ]
    + ["nan", "inf", "GiB", "1.5.5GiB", "-0"],
    "size0": ["-1GiB", "lots", "12XB", "", "1e400", "2000000TiB", "1000TiB", "nan", "inf", "GiB", "-5"],
    "choice": ["", "nope", " ", "x" * 300],
    "name": ["", "nope-not-a-thing", " ", "x" * 300],
    "ids": ["1,,2", ",", "", "a,b", "-1,2", f"1,{HUGE}", "1.5", "1;2"],
    "ints": ["1,,2", ",", "", "a,b", "0,1", "-1,2", f"1,{HUGE}", "1.5", "1;2"],
    "policies": ["a,,b", ",", "", "nope", "reference,"],
    "shares": ["full=", "=0.5", ",", "", "full=nan", "full=2", "full", "full=0.5,,sliding=0.5", "nope=1"],
    "range": ["a:b", "0.9:0.1", "1:2", ":", "", "0.5", "nan:0.9", "-1:0.5"],
    "rate": ["abc", "-1", "0", "nan", "", "-inf"],
    "non_negative_float": ["-1", "nan", "inf", "abc", "", "1e400"],
    "slo": ["", "ttft=2s", "ttft_p99", "ttft_p99=fast", "ttft_p99=-1s", "nope_p99=1s", "ttft_p99=1s,ttft_p99=2s"],
    "routers": ["", "nope", "kv,,round-robin", "kv:nope"],
    "path_in": [
        "{tmp}/missing.file",
        "{tmp}",
        "{tmp}/empty.file",
        "{tmp}/binary.file",
        "{tmp}/latin1.file",
        "{tmp}/fifo.file",
        "{tmp}/socket.file",
    ],
    # a FIFO nobody reads and a socket: written through or refused, never replaced or waited on
    "path_out": ["/proc/nope/x", "{tmp}/no/such/dir/x", "{tmp}", "", "{tmp}/fifo.file", "{tmp}/socket.file"],
    "path_base": ["/proc/nope/x", "{tmp}/no/such/dir/x", "{tmp}", ""],  # OUT of OUT.json / OUT.csv
    "endpoint": ["", "nope", "tcp://"],
    "engine": ["", "nope", "vllm@0.0.1", "vllm@", ",", "vllm,,sglang"],
    "gpu_count": ["", "nope", "h100x0", f"h100x{HUGE}", "h100x-1"],
    "dtype": ["", "int3", "fp9", "x" * 300],
    "device": ["", "nope", "mps", "xpu", "meta", "cuda:99"],
    "folder": ["{tmp}/missing.file", "{tmp}/empty.file", "{tmp}/fifo.file", ""],
}


def kind(command: str, action: argparse.Action) -> str | None:
    """The kind of bad value `action` takes (a key of BAD), or None for an
    option with nothing generic to get wrong (a switch, a free-text label)."""
    if isinstance(action, (argparse._HelpAction, argparse._StoreConstAction, argparse.BooleanOptionalAction)):
        return None
    flags = action.option_strings
    name = flags[-1] if flags else action.dest
    qual = getattr(action.type, "__qualname__", "")
    metavar = str(action.metavar or "")
    if name in KIND_BY_FLAG.get(command, {}):
        return KIND_BY_FLAG[command][name]
    if name in KIND_BY_FLAG["*"]:
        return KIND_BY_FLAG["*"][name]
    if action.choices is not None:
        return "choice"
    if qual.startswith("int_at_least"):
        return "count" if action.default != 0 else "count0"
    if qual == "optional_tokens":
        return "tokens"
    if qual == "positive_float":
        return "positive_float"
    if qual == "non_negative_float":
        return "non_negative_float"
    if qual.startswith("size_arg"):
        return "size0" if name in ZERO_SIZES else "size"
    if metavar == "SIZE":
        return "size0" if name in ZERO_SIZES else "size"
    return None


ZERO_SIZES = {"--cuda-graph-memory", "--activation-memory", "--reserved-memory", "--weights-memory"}
# Kinds a flag's definition cannot tell (free-text options whose text is read later).
KIND_BY_FLAG: dict[str, dict[str, str | None]] = {
    "*": {
        "--json": None,
        "--quiet": None,
        "--model-id": None,  # any label
        "--draft-model": "name",  # a model: preset, path, hub id, or mtp
        "--kv-events-topic": None,  # any topic, but only with --kv-events (tested apart)
        "--ray-address": None,  # a Ray address is Ray's to judge
        "--kv-dtype": "dtype",
        "--gpu": "name",
        "--sim-gpu": "name",
        "--memory-fraction": "fraction",
        "--gpu-memory-utilization": "fraction",
        "--cuda-graph-batch-sizes": "ints",
        "--draft-lens": "ints",
        "--pool-ratio": "shares",
        "--workload": "path_in",
        "--trace": "path_in",
        "--calibration": "path_in",
        "--plot": "path_out",
        "--kv-events": "endpoint",
        "--kv-events-replay": "endpoint",
        "--workload-rate": "rate",
        "--rate": "rate",
        "--slo": "slo",
        "--link": "name",
        "--ranks-per-node": "count",
        "--engine": "engine",
        "--compare": "policies",
        "--policy": "policies",
        "--sweep-ratio": "name",
        "--sweep-range": "range",
        "--weights-bytes": "size",
        "--prompt": None,  # any text
        "--prompt-ids": "ids",
        "--seed": "seed",
        "--speculate": "speculate",
        "--device": "device",
        "model": "name",
        "model_dir": "path_in",
        "grid": "path_in",
    },
    "generate": {"--kv-memory": "size"},
    "fit": {"--gpu": "gpu_count", "--emit-to": "path_out", "--engine": "engine", "--routers": "routers"},
    "calibrate": {"--steps": "path_in", "--ops": "path_in", "--out": "path_out"},
    "sweep": {"--out": "path_base", "--workers": "count"},
    "serve": {"--port": "port", "--models-dir": "folder"},
    "simulate": {"--seed": "count0", "--host-memory": "size0"},  # --host-memory: a list of sizes, 0 allowed
}


@dataclass(frozen=True)
class Case:
    """One command line with one bad value; `flag` is what the error must name."""

    command: str
    flag: str
    value: str

    def argv(self, tmp: str) -> list[str]:
        base = BASE[self.command].replace("{tmp}", tmp).split()
        if self.flag.startswith("-"):
            base = _drop(base, self.flag)
            if self.flag in GPU_ONLY:
                base = _drop(base, "--kv-memory")
            extra = NEEDS.get(self.flag, "").split()
            if extra and extra[0] in base:
                extra = []
            return [*base, *extra, f"{self.flag}={self.value.replace('{tmp}', tmp)}"]
        # a positional: the one after the command
        return [base[0], self.value.replace("{tmp}", tmp), *base[2:]]

    @property
    def id(self) -> str:
        shown = self.value if len(self.value) < 24 else self.value[:20] + "..."
        return f"{self.command} {self.flag}={shown!r}"


def _drop(argv: list[str], flag: str) -> list[str]:
    """`argv` without `flag` and its value (if present)."""
    if flag not in argv:
        return argv
    i = argv.index(flag)
    takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
    return argv[:i] + argv[i + 1 + takes_value :]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flags() -> Iterator[tuple[str, argparse.Action, str | None]]:
    """(command, action, kind) for every option and positional of every command."""
    for command, p in subparsers().items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            yield command, action, kind(command, action)


def cases() -> list[Case]:
    out: list[Case] = []
    for command, action, k in flags():
        if k is None:
            continue
        name = action.option_strings[-1] if action.option_strings else action.dest
        if name.startswith("-") and not name.startswith("--"):
            continue
        out.extend(Case(command, name, v) for v in BAD[k])
    return out


def random_cases(n: int, seed: int) -> list[Case]:
    """`n` cases of random bad values (mutations of the generated ones): for the soak run."""
    rng = random.Random(seed)
    base = cases()
    junk = ["\x00", "\u00e9", "\t", "--", "=", "%s", "{}", "\\", "\n", "1" * 50, "-", "e9"]
    out = []
    for _ in range(n):
        c = rng.choice(base)
        value = c.value
        for _ in range(rng.randint(1, 3)):
            at = rng.randint(0, len(value))
            value = value[:at] + rng.choice(junk) + value[at:]
        out.append(Case(c.command, c.flag, value))
    return out


def lay_out_files(folder: Path) -> Path:
    """The inputs the base command lines read and the bad files the cases name, in `folder`."""
    (folder / "empty.file").write_text("")
    (folder / "binary.file").write_bytes(bytes(range(256)) * 4)
    (folder / "latin1.file").write_bytes("caf\u00e9,1\n".encode("latin-1"))
    (folder / "grid.yaml").write_text(
        "model: llama-3.1-8b-instruct\ngpu: h100\nkv_memory: 4GiB\ntrace: azure-conv\nmax_requests: 20\n"
    )
    (folder / "steps.csv").write_text("")
    os.mkfifo(folder / "fifo.file")
    with socket.socket(socket.AF_UNIX) as s:  # the socket file stays after the socket closes
        s.bind(str(folder / "socket.file"))
    return folder
