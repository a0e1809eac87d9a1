"""Every JSON and CSV reader bounds numbers and nesting (kvpool/jsonsafe.py), and
every input that could be a FIFO is refused before it is opened: traces,
safetensors headers and their index, grids, calibration profiles, model configs
and generation configs. The issue's crashes: 5,000-digit integers and deep
nesting (internal errors), a 4,000-digit count (OverflowError), a FIFO as a
model folder's file (a hang)."""

from __future__ import annotations

import json
import math
import os
import signal
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool import jsonsafe

CONFIGS = Path(__file__).parent / "data" / "configs"
SIM = "simulate llama-3.1-8b-instruct --gpu h100 --kv-memory 4GiB --max-requests 20 --quiet"

# bad JSON numbers and nestings, as text to put where a value goes
BAD_VALUES = {
    "5000 digits": "9" * 5000,
    "4000 digits": "9" * 4000,
    "negative 5000 digits": "-" + "9" * 5000,
    "deep": "[" * 100_000 + "]" * 100_000,
    "NaN": "NaN",
    "Infinity": "-Infinity",
    "1e400": "1e400",
}


@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(10**29), 10**29) | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
        max_leaves=20,
    )
)  # fmt: skip
def test_bounded_json_reads_what_json_writes(value: Any) -> None:
    assert jsonsafe.loads(json.dumps(value)) == value
    assert jsonsafe.loads(json.dumps(value).encode("utf-8-sig")) == value


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_bounded_json_refuses_each_bad_value(name: str) -> None:
    with pytest.raises(jsonsafe.JSONValueError):
        jsonsafe.loads('{"a": [1, VALUE]}'.replace("VALUE", BAD_VALUES[name]))


def put(folder: Path, value: str) -> dict[str, tuple[list[str], str]]:
    """Files holding `value` where each reader reads a number, and the command
    line that reads each (the flag or word its error must name)."""
    (folder / "t.jsonl").write_text('{"input_length": VALUE, "output_length": 5}\n'.replace("VALUE", value))
    (folder / "g.json").write_text(
        '{"model": "llama-3.1-8b-instruct", "gpu": "h100", "kv_memory": "4GiB", "max_requests": VALUE}'.replace(
            "VALUE", value
        )
    )
    (folder / "p.json").write_text('{"calibration": {"row_s": VALUE}}'.replace("VALUE", value))
    config = json.loads((CONFIGS / "Llama-3.2-1B-Instruct.json").read_text())
    for name in ("header", "index", "config", "generation"):
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps(config))
    header = '{"w": {"dtype": "F16", "shape": [VALUE], "data_offsets": [0, 2]}}'.replace("VALUE", value).encode()
    (folder / "header" / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    (folder / "index" / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": VALUE}}'.replace("VALUE", value)
    )
    (folder / "config" / "config.json").write_text(
        json.dumps(config)[:-1] + ', "head_dim": VALUE}'.replace("VALUE", value)
    )
    (folder / "generation" / "generation_config.json").write_text('{"eos_token_id": VALUE}'.replace("VALUE", value))
    generate = ["generate", "--prompt-ids", "1,2", "--max-new-tokens", "1"]
    return {
        "trace": ([*SIM.split(), "--trace", str(folder / "t.jsonl")], "--trace"),
        "grid": (["sweep", str(folder / "g.json"), "--out", str(folder / "o"), "--serial", "--quiet"], "grid"),
        "calibration": (
            [*SIM.split(), "--trace", "azure-conv", "--calibration", str(folder / "p.json")],
            "calibration",
        ),
        "safetensors header": (["fit", str(folder / "header"), "--gpu", "h100"], "safetensors"),
        "safetensors index": (["fit", str(folder / "index"), "--gpu", "h100"], "index"),
        "config.json": (["inspect", str(folder / "config")], "config"),
        "generation config": ([*generate[:1], str(folder / "generation"), *generate[1:]], "generation"),
    }


READERS = ["trace", "grid", "calibration", "safetensors header", "safetensors index", "config.json"]


@pytest.fixture
def deadline() -> Iterator[None]:
    def expire(*_: Any) -> None:
        raise TimeoutError("a reader waited 20 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def refused(result: tuple[int, str, str], word: str) -> None:
    code, _, err = result
    assert code == 2, f"exit {code}: {err!r}"
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    assert word.lower() in err.lower() and len(err) < 600, err


@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
@pytest.mark.parametrize("reader", [*READERS, "generation config"])
def test_every_json_reader_bounds_numbers_and_nesting(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path, reader: str, bad: str, deadline: None
) -> None:
    if reader == "generation config":
        pytest.importorskip("torch")
    argv, word = put(tmp_path, BAD_VALUES[bad])[reader]
    refused(cli(*argv), word)


@pytest.mark.parametrize("cell", ["9" * 5000, "9" * 4000, "1e300", "nan", "inf", "-inf", "1e400"], ids=lambda c: c[:8])
def test_a_trace_csv_bounds_its_cells(cli: Callable[..., tuple[int, str, str]], tmp_path: Path, cell: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"input_length,output_length\n{cell},5\n")
    refused(cli(*SIM.split(), "--trace", str(path)), "--trace")


@pytest.mark.parametrize(
    "where",
    ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json", "generation_config.json"],
)
@pytest.mark.parametrize("command", ["fit", "generate"])
def test_a_fifo_in_a_model_folder_is_refused_not_waited_on(
    cli: Callable[..., tuple[int, str, str]], tmp_path: Path, where: str, command: str, deadline: None
) -> None:
    if command == "generate":
        pytest.importorskip("torch")
    folder = tmp_path / "model"
    folder.mkdir()
    if where != "config.json":
        (folder / "config.json").write_text((CONFIGS / "Llama-3.2-1B-Instruct.json").read_text())
    os.mkfifo(folder / where)
    argv = ["fit", str(folder), "--gpu", "h100"] if command == "fit" else ["generate", str(folder), "--prompt-ids", "1"]
    if command == "fit" and where in ("tokenizer.json", "generation_config.json"):
        pytest.skip("fit reads neither")
    refused(cli(*argv), str(folder))


def test_the_bounds_are_above_every_published_value() -> None:
    """No published config in tests/data/configs comes near the bounds (Nemotron-H's
    time_step_limit holds Infinity, as Python's json writes it: configs allow it)."""
    for path in CONFIGS.glob("*.json"):
        jsonsafe.loads(path.read_bytes(), constants=True)
    assert math.log10(2**64) < jsonsafe.MAX_DIGITS
