"""The bad inputs that no flag's type describes, one test per class:
values that only fail against the model (--tp, --max-seq-len), absurd sizes,
devices, flags that mean nothing without another, broken configs and grids,
closed stdout, `~` without a home, and outputs that must never be left half
written. Each: exit 2, one line on stderr naming what is wrong, no traceback."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CONFIGS = Path(__file__).parent / "data" / "configs"
QWEN25 = CONFIGS / "Qwen2.5-7B-Instruct.json"  # published config (tests/data/configs/SOURCES.md)
PLAN = ["plan", "llama-3.1-8b-instruct", "--kv-memory", "16GiB"]
TINY = ["generate", "--tiny", "llama", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]


def refused(result: tuple[int, str, str], *words: str) -> str:
    code, out, err = result
    assert code == 2, f"exit {code}: {err!r}"
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    for word in words:
        assert word.lower() in err.lower(), f"{word!r} not in {err!r}"
    assert out == "", out[:200]
    return err


def test_tp_that_does_not_divide_the_attention_heads_is_refused_as_vllm_does(cli: Any) -> None:
    """vLLM's ModelConfig.verify_with_parallel_config raises "Total number of
    attention heads (28) must be divisible by tensor parallel size (8)" for
    Qwen2.5-7B at TP 8; kvpool refuses the same layout, and plans TP 4 (28 = 4 x 7)."""
    heads = json.loads(QWEN25.read_text())["num_attention_heads"]
    bad = next(tp for tp in range(2, heads + 2) if heads % tp)
    good = next(tp for tp in range(heads, 1, -1) if heads % tp == 0 and tp <= 8)
    err = refused(cli("plan", str(QWEN25), "--kv-memory", "5GiB", "--tp", str(bad)), "--tp", f"{heads} attention")
    assert f"size {bad} " in err
    refused(cli("plan", str(QWEN25), "--kv-memory", "5GiB", "--tp", "8"), "size 8 ", "--tp")
    refused(cli("fit", str(QWEN25), "--gpu", "h100x8"), "--gpu h100x8", "8 GPUs", f"{heads} attention")
    refused(cli("inspect", str(QWEN25), "--tp", "8"), "size 8 ", "--tp")
    refused(cli("plan", "llama-3.1-8b-instruct", "--kv-memory", "5GiB", "--tp", "1000000"), "--tp")
    code, _, err = cli("plan", str(QWEN25), "--kv-memory", "5GiB", "--tp", str(good))
    assert code == 0, err


def test_max_seq_len_past_the_models_positions_is_refused(cli: Any) -> None:
    """Up to max_position_embeddings plans; one past it is refused, naming the limit
    (vLLM refuses a max_model_len past the derived one unless told otherwise)."""
    positions = json.loads(QWEN25.read_text())["max_position_embeddings"]
    args = ["plan", str(QWEN25), "--kv-memory", "20GiB", "--max-batch-size", "4"]
    code, _, err = cli(*args, "--max-seq-len", str(positions))
    assert code == 0, err
    refused(cli(*args, "--max-seq-len", str(positions + 1)), "--max-seq-len", f"{positions:,}")
    refused(cli(*args, "--max-seq-len", str(2**40)), "--max-seq-len")
    fit = ["fit", str(QWEN25), "--gpu", "h100", "--users", "4"]
    refused(cli(*fit, "--len", str(positions + 1)), "--len", f"{positions:,}")
    code, _, err = cli(*fit, "--len", str(positions))
    assert code == 0, err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-batch-size", str(2**16 + 1)), ("--max-batch-size", str(2**40)), ("--kv-memory", "2000000TiB")],
)
def test_absurd_limits_are_refused_at_once(cli: Any, flag: str, value: str) -> None:
    """--max-batch-size 2**40 once took 17 GB and never ended: refused before any work."""
    argv = [a for a in PLAN if a not in ("--kv-memory", "16GiB")] + (["--kv-memory", "16GiB"] * (flag != "--kv-memory"))
    start = time.perf_counter()
    refused(cli(*argv, flag, value), flag)
    assert time.perf_counter() - start < 5


def test_the_largest_batch_size_still_plans(cli: Any) -> None:
    code, _, err = cli(*PLAN, "--max-batch-size", str(2**16))
    assert code == 0, err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([*PLAN, "--workload-rate", "5"], ["--workload-rate", "--sizing tuned"]),
        ([*PLAN, "--sim-gpu", "h100"], ["--sim-gpu", "--sizing tuned"]),
        ([*TINY, "--kv-events-topic", "t"], ["--kv-events-topic", "needs --kv-events"]),
        ([*TINY, "--kv-events-replay", "tcp://*:5599"], ["--kv-events-replay", "needs --kv-events"]),
        ([*TINY, "--kv-events-wire", "array"], ["--kv-events-wire", "needs --kv-events"]),
        ([*TINY, "--kv-events-media", "kvpool"], ["--kv-events-media", "needs --kv-events"]),
        ([*PLAN, "--block-size", "32"], ["--block-size", "--engine vllm"]),
        ([*PLAN, "--engine", "sglang", "--block-size", "32"], ["--block-size", "--engine vllm"]),
        ([*PLAN, "--no-async-scheduling"], ["--no-async-scheduling", "--engine vllm"]),
        ([*PLAN, "--model-id", "org/x"], ["--model-id", "--emit"]),
        ([*PLAN, "--host-rule", "vllm"], ["--host-rule", "--host-memory"]),
        ([*PLAN, "--ranks-per-node", "4"], ["--ranks-per-node", "--host-memory"]),
        (["generate", "some/folder", "--prompt-ids", "1", "--chat"], ["--chat", "--prompt-ids"]),
        (["generate", "some/folder", "--prompt-ids", "1", "--seed", "3"], ["--seed", "--tiny"]),
        ([*TINY, "--hash-lookahead", "1", "--no-reuse"], ["--hash-lookahead", "--no-reuse"]),
        (
            ["simulate", "qwen3-0.6b", "--gpu", "h100", "--trace", "azure-conv", "--hash-lookahead", "1"],
            ["--hash-lookahead", "hash ids"],
        ),
        ([*TINY, "--hash-lookahead", "-1"], ["--hash-lookahead", "non-negative"]),
    ],
    ids=[
        "workload-rate",
        "sim-gpu",
        "topic",
        "replay",
        "wire",
        "media",
        "block-size",
        "block-size-sglang",
        "async",
        "model-id",
        "host-rule",
        "ranks-per-node",
        "chat-ids",
        "seed",
        "lookahead-reuse",
        "lookahead-trace",
        "lookahead-negative",
    ],
)
def test_a_flag_without_the_one_it_depends_on_is_refused(cli: Any, argv: list[str], words: list[str]) -> None:
    if argv[0] == "generate":
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    refused(cli(*argv), *words)


@pytest.mark.parametrize("device", ["mps", "xpu", "meta", "cuda:99", "nope"])
def test_a_device_this_torch_cannot_use_is_one_line(cli: Any, device: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if device == "cuda:99" and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    refused(cli(*TINY, "--device", device), "--device")


@pytest.mark.parametrize(
    ("flag", "value"), [("--tokens-per-block", str(2**40)), ("--speculate", str(2**40)), ("--speculate", str(10**30))]
)
def test_generate_refuses_pages_or_drafts_past_the_models_positions(cli: Any, flag: str, value: str) -> None:
    """A 2**40-token page or 2**40 drafts once asked torch for petabytes."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    start = time.perf_counter()
    refused(cli(*TINY, flag, value), flag)
    assert time.perf_counter() - start < 30


def _config(tmp_path: Path, name: str, **fields: Any) -> Path:
    config = json.loads((CONFIGS / "Qwen3-0.6B.json").read_text())
    config.update(fields)
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_configs_with_bad_fields_are_one_line(cli: Any, tmp_path: Path) -> None:
    layers = json.loads((CONFIGS / "Qwen3-0.6B.json").read_text())["num_hidden_layers"]
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"num_hidden_layers": 1})[:-1] + ', "vocab_size": ' + "9" * 5000 + "}")
    refused(cli("inspect", str(huge)), "5000 digits")
    refused(cli("inspect", str(_config(tmp_path, "dtype.json", torch_dtype="float7"))), "torch_dtype")
    long = _config(tmp_path, "long.json", layer_types=["full_attention"] * (layers + 1))
    refused(cli("inspect", str(long)), "layer_types", f"{layers + 1} entries")
    refused(cli("inspect", str(_config(tmp_path, "empty.json", layer_types=[]))), "layer_types", "0 entries")
    code, _, err = cli("inspect", str(_config(tmp_path, "ok.json", layer_types=["full_attention"] * layers)))
    assert code == 0, err


def test_the_library_raises_a_typed_error_for_the_same_configs(tmp_path: Path) -> None:
    from kvpool import load_model_spec
    from kvpool.errors import SpecError

    for path in (_config(tmp_path, "d.json", torch_dtype="float7"), _config(tmp_path, "e.json", layer_types=[])):
        with pytest.raises(SpecError):
            load_model_spec(str(path))


def test_a_fifo_as_model_or_grid_is_refused_not_waited_on(cli: Any, tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    start = time.perf_counter()
    refused(cli("inspect", str(fifo)), "pipe")
    os.rename(fifo, tmp_path / "grid.yaml")
    refused(cli("sweep", str(tmp_path / "grid.yaml"), "--out", str(tmp_path / "s")), "not a regular file")
    assert time.perf_counter() - start < 5


def test_tilde_without_a_home_is_one_line(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No HOME and no password entry: `~` cannot be expanded (Path.expanduser raises RuntimeError)."""
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(_uid: int) -> Any:
        raise KeyError("no such user")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    refused(cli("inspect", "~/config.json"), "home")
    refused(cli("sweep", "~/grid.yaml"), "home")


GRID = "model: llama-3.1-8b-instruct\ngpu: h100\nkv_memory: 4GiB\ntrace: azure-conv\nmax_requests: 20\n"


@pytest.mark.parametrize(
    ("name", "content", "word"),
    [
        ("nested.yaml", GRID + "max_seq_len: [[1024, 2048]]\n", "nested"),
        ("mapping.yaml", GRID + "rate: {a: 1}\n", "nested"),
        ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("binary.yaml", bytes(range(256)) * 8, "not UTF-8"),
        ("latin1.yaml", (GRID + "# caf\u00e9\n").encode("latin-1"), "not UTF-8"),
        ("tag.yaml", GRID + "seed: !!python/object/apply:os.system ['echo hi']\n", "grid"),
        (
            "billion.yaml",
            GRID.replace("max_requests: 20", "max_requests: [{r}]\nseed: [{r}]\nmax_seq_len: [{r}]"),
            "10,000",
        ),
        ("sweep.yaml", GRID + "sweep: {group: full, points: 1000000000}\n", "points"),
    ],
)
def test_bad_sweep_grids_are_one_line_and_write_nothing(
    cli: Any, tmp_path: Path, name: str, content: str | bytes, word: str
) -> None:
    """A grid of 10**9 points is refused from the lengths of its lists, never expanded."""
    if isinstance(content, str) and "{r}" in content:
        content = content.replace("{r}", ", ".join(str(i) for i in range(1, 1001)))
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    start = time.perf_counter()
    refused(cli("sweep", str(path), "--out", str(tmp_path / "res"), "--serial", "--quiet"), word)
    assert time.perf_counter() - start < 10
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def _kvpool(*argv: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", *argv], stderr=subprocess.PIPE, text=True, timeout=120, **kwargs
    )


def test_a_reader_that_leaves_is_not_an_error() -> None:
    """`kvpool plan ... | head -c0`: the pipe closes before the table is written."""
    reader = subprocess.Popen(["head", "-c0"], stdin=subprocess.PIPE)
    assert reader.stdin is not None
    done = _kvpool(*PLAN, stdout=reader.stdin)
    reader.stdin.close()
    reader.wait(timeout=30)
    assert done.returncode == 0 and "Traceback" not in done.stderr and done.stderr == "", done.stderr


def test_a_closed_stdout_is_one_line() -> None:
    """Started with stdout closed (`kvpool models >&-`): sys.stdout is None."""
    done = _kvpool("models", stdout=None, pass_fds=(), preexec_fn=lambda: os.close(1))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "stdout is closed" in done.stderr, done.stderr


LIBRARY_BAD = [True, 1.5, None, b"40GiB", [1], {}, float("nan"), object()]


@pytest.mark.parametrize("value", LIBRARY_BAD, ids=[type(v).__name__ for v in LIBRARY_BAD])
@pytest.mark.parametrize("name", ["units.parse_size", "presets.load_gpu", "presets.load_model_config"])
def test_the_readers_the_cli_shares_raise_a_typed_error(name: str, value: Any) -> None:
    """The CLI's types call these readers (cli/common.py `checked`); a library caller
    passing a non-string gets the same typed KvpoolError, never a TypeError or
    AttributeError (parse_size(True) was 1 byte)."""
    import importlib

    from kvpool.errors import KvpoolError

    module, function = name.split(".")
    reader = getattr(importlib.import_module(f"kvpool.{module}"), function)
    with pytest.raises(KvpoolError):
        reader(value)


def test_a_preset_name_is_not_a_path() -> None:
    from kvpool import presets
    from kvpool.errors import UnknownPresetError

    with pytest.raises(UnknownPresetError):
        presets.load_model_config("../gpus")


def test_fit_emit_to_a_missing_folder_is_refused_before_the_work(cli: Any, tmp_path: Path) -> None:
    argv = ["fit", "llama-3.1-8b-instruct", "--gpu", "h100", "--engine", "vllm"]
    refused(cli(*argv, "--emit-to", str(tmp_path / "no" / "x.sh")), "--emit-to", "no folder")
    code, _, err = cli(*argv, "--emit-to", str(tmp_path / "x.sh"))
    assert code == 0 and (tmp_path / "x.sh").read_text().startswith("vllm serve"), err
    assert [p.name for p in tmp_path.iterdir()] == ["x.sh"]


SIM_4G = "simulate llama-3.1-8b-instruct --gpu h100 --kv-memory 4GiB --trace azure-conv --max-requests 20 --quiet"


@pytest.mark.parametrize(
    ("argv", "flag", "word"),
    [
        ("plan llama-3.1-8b-instruct --kv-memory 1000TiB", "--kv-memory", "any GPU"),
        ("warmup llama-3.1-8b-instruct --kv-memory 1000TiB", "--kv-memory", "any GPU"),
        (SIM_4G.replace("4GiB", "1000TiB"), "--kv-memory", "h100 holds"),
        (SIM_4G + " --host-memory 1000TiB", "--host-memory", "keeps books"),
        (SIM_4G + " --disk 1000TiB", "--disk", "keeps books"),
        (SIM_4G + " --host-memory 0,1000TiB", "--host-memory", "keeps books"),  # before the first size's run
        ("plan llama-3.1-8b-instruct --kv-memory 4GiB --host-memory 1000TiB", "--host-memory", "keeps books"),
        (" ".join(TINY) + " --kv-memory 1000TiB", "--kv-memory", "this machine"),
        ("plan llama-3.1-8b-instruct --kv-memory 1152921504606846977", "--kv-memory", "1 EiB"),
    ],
)
def test_sizes_no_machine_holds_are_refused_before_allocating(cli: Any, argv: str, flag: str, word: str) -> None:
    """1000 TiB ran out of memory after seconds (the pools' books, or the engine's
    tensors); 2**60 + 1 bytes, read as a float, passed as 1 EiB."""
    start = time.perf_counter()
    refused(cli(*argv.split()), flag, word)
    assert time.perf_counter() - start < 10


def test_a_zero_host_tier_is_zero_in_any_unit(cli: Any) -> None:
    """`--host-memory 0B` was a run without a host tier and `0GiB` an error."""
    runs = []
    for zero in ("0", "0B", "0GiB", "0.0MiB"):
        code, out, err = cli(*SIM_4G.split(), "--host-memory", f"{zero},1GiB", "--json")
        assert code == 0, err
        run = json.loads(out)["runs"][0]
        assert run["tiers"]["bytes"] == {"CPU": 0}
        runs.append({k: v for k, v in run.items() if k not in ("policy", "host_memory")})
    assert all(r == runs[0] for r in runs)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        # the GPU count set the tensor-parallel size: the error spoke of a --tp never given
        ("fit llama-3.1-8b-instruct --gpu h100x64", ["--gpu h100x64", "64 GPUs", "32 attention heads"]),
        # --users/--len rank their own layouts: a --tp/--pp/--dp beside them was silently dropped
        ("fit llama-3.1-8b-instruct --gpu h100 --users 4 --len 4096 --tp 2", ["--tp", "ranks the layouts"]),
        ("fit llama-3.1-8b-instruct --gpu h100 --users 4 --len 4096 --pp 2 --dp 1", ["--pp"]),
        ("fit llama-3.1-8b-instruct --gpu h100 --users 4 --len 4096 --tp 2 --dp 2", ["--tp / --dp"]),
        # `vllm@` named no release and was read as the newest
        ("plan llama-3.1-8b-instruct --kv-memory 4GiB --engine vllm@", ["--engine", "names no release"]),
        ("fit llama-3.1-8b-instruct --gpu h100 --engine sglang@", ["--engine"]),
    ],
)
def test_the_issues_wording_cases(cli: Any, argv: str, words: list[str]) -> None:
    refused(cli(*argv.split()), *words)


def test_a_full_stdout_names_it_not_an_output_file() -> None:
    """The error read "(writing the output)" for any OSError without a file."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = _kvpool(*PLAN, stdout=full)
    assert done.returncode == 2 and "standard output" in done.stderr and done.stderr.count("\n") == 1, done.stderr
