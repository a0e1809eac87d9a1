"""`kvpool calibrate`: a profile from kernel timings (Vidur's, measured on an
H100) and from whole-step timings, used by `simulate --calibration`; bad
measurements get one line and exit 2."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kvpool.presets import load_gpu
from kvpool.sim.calibration import load_profile, shipped
from kvpool.sim.steptime import StepTimeModel, load_weights
from kvpool.spec import load_model_spec

ROOT = Path(__file__).resolve().parent.parent
VIDUR_H100 = ROOT / "tests" / "data" / "vidur" / "h100_meta-llama_Llama-2-7b-hf.csv"
Cli = Callable[..., tuple[int, str, str]]


def test_ops_profile_from_vidurs_h100_timings(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "h100-mine.json"
    code, stdout, err = cli(
        "calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "--ops", str(VIDUR_H100), "-o", str(out), "--json"
    )
    assert code == 0, err
    report = json.loads(stdout)
    cal = load_profile(out)
    assert cal.name == "h100-mine"
    # measured on a real H100: shares of peak below 1, a floor of a few microseconds
    assert 0.5 < cal.linear_flops_eff <= 1.0 and 0.5 < cal.linear_bw_eff <= 1.0
    assert 1e-6 < cal.linear_floor_s < 2e-5
    assert report["fit"]["ops"]["matmul"]["median_error"] < 0.10
    # constants the timings do not measure stay the GPU's shipped ones
    assert cal.step_floor_s == shipped()["h100"].step_floor_s
    code, stdout, err = cli(
        "simulate", "llama-3.1-8b-instruct", "--gpu", "h100", "--trace", "azure-conv", "--max-requests", "20",
        "--calibration", str(out), "--json", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(stdout)["calibration"] == "h100-mine"


def measured_steps(path: Path, speed: float = 0.9, encoding: str = "utf-8") -> Path:
    """Steps "measured" on a machine `speed` x as fast as the shipped H100 profile,
    with a 2 ms step floor and 20 us per request, written to `path`."""
    spec = load_model_spec("llama-3.1-8b-instruct", max_seq_len=8192)
    model = StepTimeModel.build(spec, load_gpu("h100"), load_weights("llama-3.1-8b-instruct"))
    with path.open("w", newline="", encoding=encoding) as f:
        w = csv.writer(f)
        w.writerow(["decode_rows", "context", "prefill_tokens", "ms"])
        for rows, ctx, pre in [(1, 100, 0), (8, 2000, 0), (64, 1000, 0), (256, 500, 0), (0, 0, 2048), (16, 800, 512)]:
            c = model.cost([(ctx, 0)] * rows, [(0, pre)] if pre else [], graph=pre == 0, padded_batch=rows or None)
            gpu = c.total - c.overhead
            requests = rows + (1 if pre else 0)
            w.writerow([rows, ctx, pre, (gpu / speed + 2e-3 + 20e-6 * requests) * 1e3])
    return path


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig"])  # -sig: the byte-order mark spreadsheets write
def test_steps_profile_recovers_the_machine_that_made_the_timings(cli: Cli, tmp_path: Path, encoding: str) -> None:
    # the fit must find the machine's three numbers back
    path = measured_steps(tmp_path / "steps.csv", encoding=encoding)
    out = tmp_path / "steps.json"
    code, stdout, err = cli("calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "--steps", str(path), "-o", str(out))
    assert code == 0, err
    cal = load_profile(out)
    base = shipped()["h100"]
    assert cal.linear_bw_eff == pytest.approx(base.linear_bw_eff * 0.9, rel=1e-6)
    assert cal.step_floor_s == pytest.approx(2e-3, rel=1e-6) and cal.row_s == pytest.approx(20e-6, rel=1e-6)
    assert "wrote" in stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("decode_rows,context\n1,2\n", "lacks column(s) prefill_tokens"),
        ("decode_rows,context,prefill_tokens\n1,2,0\n", "'ms' or 'seconds'"),
        ("decode_rows,context,prefill_tokens,ms\n1,2,0,-3\n", "ms must be a number >= 0"),
        ("decode_rows,context,prefill_tokens,ms\n1,x,0,3\n", "context must be a number"),
        ("decode_rows,context,prefill_tokens,ms\n0,2,0,3\n", "needs decode rows or prefill tokens"),
        ("decode_rows,context,prefill_tokens,ms\n", "has no rows"),
        # 10**9 rows built a billion-row batch (MemoryError); 1.5 rows is no count
        ("decode_rows,context,prefill_tokens,ms\n1000000000,2,0,3\n", "decode_rows must be a whole number <= 65,536"),
        ("decode_rows,context,prefill_tokens,ms\n1.5,2,0,3\n", "decode_rows must be a whole number"),
        ("decode_rows,context,prefill_tokens,ms\n1,%s,0,3\n" % ("9" * 5000), "context must be a number"),
        ("decode_rows,context,prefill_tokens,ms\n1,2,0,Infinity\n", "ms must be a number"),
        ("decode_rows,context,prefill_tokens,ms\n1,2,0,NaN\n", "ms must be a number"),
    ],
)
def test_bad_step_files_get_one_line(cli: Cli, tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "steps.csv"
    path.write_text(content)
    out = tmp_path / "p.json"
    code, stdout, err = cli("calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "--steps", str(path), "-o", str(out))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_calibrate_needs_measurements_and_readable_files(cli: Cli, tmp_path: Path) -> None:
    code, _, err = cli("calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "-o", str(tmp_path / "p.json"))
    assert code == 2 and "--steps" in err
    code, _, err = cli(
        "calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "--ops", str(tmp_path / "nope.csv"), "-o", "p.json"
    )
    assert code == 2 and "cannot read" in err
    code, _, err = cli(
        "simulate",
        "llama-3.1-8b-instruct",
        "--gpu",
        "h100",
        "--trace",
        "azure-conv",
        "--calibration",
        str(ROOT / "README.md"),
    )
    assert code == 2 and "not JSON" in err


@pytest.mark.parametrize("speed", [1.7, 3.0, 1e6])
def test_steps_faster_than_the_gpus_peak_are_refused(cli: Cli, tmp_path: Path, speed: float) -> None:
    """Steps `speed` x faster than the shipped H100 profile put its matmuls' bandwidth
    share past 100 % (the issue's fits reached 10**294x the peak): no GPU runs that,
    so no profile is written."""
    base = shipped()["h100"]
    assert base.linear_bw_eff * speed > 1
    path, out = tmp_path / "steps.csv", tmp_path / "p.json"
    measured_steps(path, speed=speed)
    code, stdout, err = cli("calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "--steps", str(path), "-o", str(out))
    assert code == 2 and "--steps" in err and "faster than the GPU's peak allows" in err, err
    assert "linear_bw_eff" in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_gpu_count_is_the_tensor_parallel_size(cli: Cli, tmp_path: Path) -> None:
    """`--gpu h100x2` times the steps of one rank of tp 2, as `--gpu h100 --tp 2` does."""
    path = tmp_path / "steps.csv"
    measured_steps(path)
    two, tp2 = tmp_path / "two.json", tmp_path / "tp2.json"
    code, _, err = cli("calibrate", "llama-3.1-8b-instruct", "--gpu", "h100x2", "--steps", str(path), "-o", str(two))
    assert code == 0, err
    code, _, err = cli(
        "calibrate", "llama-3.1-8b-instruct", "--gpu", "h100", "--tp", "2", "--steps", str(path), "-o", str(tp2)
    )
    assert code == 0, err
    assert json.loads(two.read_text())["calibration"] == {
        **json.loads(tp2.read_text())["calibration"],
        "name": "two",
    }
