"""Bad input, from the command line and the library: exit 2 with one line
naming what was wrong (never exit 1, never exit 0 on nonsense), a typed kvpool
error from the library, and nothing half-changed.

Each row is (arguments, a word the message must contain); `{d}` is a folder of
bad files laid out by the `bad_files` fixture."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bad_input_helpers import LIBRARY_CASES, LibraryCase

DATA = Path(__file__).parent / "data" / "configs"
SIM = "simulate llama-3.1-8b-instruct --gpu h100 --kv-memory 4GiB --max-seq-len 4096 --trace azure-conv --max-requests 40 --quiet"
PLAN = "plan llama-3.1-8b-instruct --kv-memory 16GiB"

CLI_CASES = [
    ("inspect {d}/inf.json", "head_dim"),
    ("inspect {d}/huge_layers.json", "num_hidden_layers"),
    ("inspect {d}/huge_heads.json", "num_attention_heads"),
    ("inspect {d}/nested.json", "nested"),
    ("inspect /dev/zero", "larger than"),
    ("plan llama-3.1-8b-instruct --kv-memory 1e400", "1 EiB"),
    ("plan llama-3.1-8b-instruct --kv-memory 2000000TiB", "1 EiB"),
    ("plan llama-3.1-8b-instruct --kv-memory -1GiB", "positive"),
    ("plan llama-3.1-8b-instruct --gpu h100 --non-kv-memory -5GiB", "positive"),
    (f"{PLAN} --max-num-tokens 0", "none"),
    (f"{PLAN} --max-batch-size 100000000000000000000", "at most"),
    (f"{PLAN} --workload {{d}}/long_request.csv", "implausibly long"),
    (f"{PLAN} --workload {{d}}/huge_trace.csv", "cut it first"),
    (f"{SIM} --active-params nan", "finite"),
    (f"{SIM} --active-params inf", "finite"),
    (f"{SIM} --sweep-ratio full --sweep-points 100000", "at most"),
    (f"{SIM} --plot /proc/nope.png", "cannot write"),
]


@pytest.fixture
def bad_files(tmp_path: Path) -> Path:
    """Bad configs and traces, each wrong in one way only."""
    base = (DATA / "Qwen3-0.6B.json").read_text()
    config = json.loads(base)
    (tmp_path / "inf.json").write_text(base.rstrip().removesuffix("}") + ', "head_dim": Infinity}')
    (tmp_path / "huge_layers.json").write_text(json.dumps({**config, "num_hidden_layers": 1e30}))
    (tmp_path / "huge_heads.json").write_text(json.dumps({**config, "num_attention_heads": 2**40}))
    (tmp_path / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "long_request.csv").write_text("prompt_len,output_len\n1e21,5\n")
    with (tmp_path / "huge_trace.csv").open("wb") as f:  # sparse: 600 MiB long, no disk used
        f.truncate(600 * 2**20)
    return tmp_path


def assert_one_line_error(code: int, err: str, word: str) -> None:
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    assert word.lower() in err.lower(), f"{word!r} not in {err!r}"


@pytest.mark.parametrize(("argv", "word"), CLI_CASES, ids=[a for a, _ in CLI_CASES])
def test_cli_bad_input_is_one_line_and_exit_2(cli: Any, bad_files: Path, argv: str, word: str) -> None:
    code, out, err = cli(*argv.format(d=bad_files).split())
    assert_one_line_error(code, err, word)
    assert out == ""  # refused before anything ran: no half-printed table


def test_an_empty_model_names_the_three_forms(cli: Any) -> None:
    code, out, err = cli("inspect", "")
    assert_one_line_error(code, err, "preset name")
    assert "hugging face id" in err.lower() and "does not exist" not in err and out == ""


def test_plot_path_is_checked_before_the_runs(cli: Any, tmp_path: Path) -> None:
    """A plot that cannot be written fails at once (not after every run), and
    the check leaves no empty file behind in a writable folder."""
    pytest.importorskip("matplotlib")
    from kvpool.sim.plot import check_target

    start = time.perf_counter()
    code, _, err = cli(*SIM.split(), "--plot", "/proc/nope.png")
    assert code == 2 and time.perf_counter() - start < 5, err
    target = tmp_path / "p.png"
    check_target(target)
    assert not target.exists()


def test_output_to_a_full_device_is_exit_2() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "kvpool", "models"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert_one_line_error(done.returncode, done.stderr, "no space left")


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kvpool.engine import weights

    config = weights.tiny_config("llama")
    return weights.save_folder(weights.hf_model(config, 0), dict(config), tmp_path / "tiny")


@pytest.mark.parametrize(
    ("header", "word"),
    [
        (struct.pack("<Q", 10**12) + b"{}", "safetensors"),  # header length past the file
        (b"\x01\x00", "safetensors"),  # shorter than the 8-byte length
        (struct.pack("<Q", 4) + b"abcd", "safetensors"),  # not JSON
    ],
    ids=["too-large", "too-small", "not-json"],
)
def test_generate_on_a_broken_safetensors_header(cli: Any, tiny_folder: Path, header: bytes, word: str) -> None:
    (tiny_folder / "model.safetensors").write_bytes(header)
    code, _, err = cli("generate", str(tiny_folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "2")
    assert_one_line_error(code, err, word)


def test_generate_past_the_models_positions(cli: Any, tiny_folder: Path) -> None:
    """`max_position_embeddings` of the saved config bounds prompt + new tokens
    (1e9 new tokens once asked for terabytes of pages)."""
    limit = json.loads((tiny_folder / "config.json").read_text())["max_position_embeddings"]
    code, _, err = cli("generate", str(tiny_folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "1000000000")
    assert_one_line_error(code, err, f"--max-new-tokens {limit - 3} or less")
    prompt = ",".join(["5"] * (limit + 1))
    code, _, err = cli("generate", str(tiny_folder), "--prompt-ids", prompt, "--max-new-tokens", "1")
    assert_one_line_error(code, err, "longer than")
    shutil.rmtree(tiny_folder)


@pytest.mark.parametrize("case", LIBRARY_CASES, ids=[c.name for c in LIBRARY_CASES])
def test_library_bad_input_is_a_typed_error_and_changes_nothing(case: LibraryCase) -> None:
    case.check()


@given(n=st.integers(-(2**70), 2**70), unit=st.sampled_from([("", 1), ("KiB", 2**10), ("GiB", 2**30), ("TB", 10**12)]))
def test_a_size_is_read_exactly_and_bounded_at_1_eib(n: int, unit: tuple[str, int]) -> None:
    """Read as a float, 2**60 + 1 bytes rounded to 2**60 and passed; every size is
    now exact, and refused exactly when it is not in [1, 2**60] bytes."""
    from kvpool.errors import KvpoolError
    from kvpool.units import MAX_SIZE, parse_size

    name, scale = unit
    if 1 <= n * scale <= MAX_SIZE:
        assert parse_size(f"{n}{name}") == n * scale
    else:
        with pytest.raises(KvpoolError):
            parse_size(f"{n}{name}")


@given(text=st.from_regex(r"[-+]?[0-9]{0,60}(\.[0-9]{0,6})?(e[-+]?[0-9]{1,20})?\s*(GiB|KB|t|B|)", fullmatch=True))
def test_any_size_text_is_read_or_refused_at_once(text: str) -> None:
    """A 20-digit exponent overflowed Decimal, and a negative one built a
    billion-digit integer: every size text is a number of bytes in [1, 2**60] or
    a KvpoolError, in well under a second."""
    from kvpool.errors import KvpoolError
    from kvpool.units import MAX_SIZE, parse_size, size_or_zero

    start = time.perf_counter()
    for read in (parse_size, size_or_zero):
        try:
            value = read(text)
        except KvpoolError:
            continue
        assert (0 if read is size_or_zero else 1) <= value <= MAX_SIZE
    assert time.perf_counter() - start < 1
