"""`kvpool sweep` and `simulate --workers`: grids, rows, files, and a Ray run
that gives the same rows as a serial one (skipped without Ray)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvpool.errors import KvpoolError
from kvpool.sim.serial_or_ray import ray_available, run_all
from kvpool.sim.sweep import (
    GridError,
    Point,
    best_shares,
    expand_grid,
    load_grid,
    run_point,
    write_rows,
)


@pytest.fixture
def trace_file(tmp_path: Path) -> str:
    path = tmp_path / "small.csv"
    rows = [f"{200 + 37 * i % 900},{5 + 13 * i % 60}" for i in range(30)]
    path.write_text("prompt_len,output_len\n" + "\n".join(rows) + "\n")
    return str(path)


def grid(trace: str) -> dict[str, object]:
    return {
        "model": "gemma-3-27b",
        "gpu": "h100",
        "kv_memory": ["1GiB", "2GiB"],
        "trace": trace,
        "max_seq_len": 4096,
        "max_batch_size": 16,
        "max_num_tokens": 1024,
        "policy": ["reference", "workload"],
        "sweep": {"group": "sliding", "points": 3},
    }


def test_grid_is_the_product_of_its_lists(trace_file: str) -> None:
    points = expand_grid(grid(trace_file))
    assert len(points) == 2 * (2 + 3)  # budgets x (policies + swept shares)
    assert [p.policy for p in points[:5]] == [
        "reference",
        "workload",
        "ratio:sliding=0.05",
        "ratio:sliding=0.5",
        "ratio:sliding=0.95",
    ]
    assert {p.kv_memory for p in points} == {"1GiB", "2GiB"} and points[0].max_batch_size == 16
    with pytest.raises(GridError, match="unknown grid fields colour"):
        expand_grid({**grid(trace_file), "colour": "red"})
    with pytest.raises(GridError, match="needs gpu"):
        expand_grid({"model": "m", "trace": "t", "kv_memory": "1GiB"})
    with pytest.raises(GridError, match="empty list"):
        expand_grid({**grid(trace_file), "gpu": []})


def test_grid_files(tmp_path: Path, trace_file: str) -> None:
    (tmp_path / "g.json").write_text(json.dumps(grid(trace_file)))
    assert load_grid(tmp_path / "g.json") == grid(trace_file)
    (tmp_path / "g.yaml").write_text(f"model: gemma-3-27b\ngpu: [h100, b200]\nkv_memory: 2GiB\ntrace: {trace_file}\n")
    pytest.importorskip("yaml")
    assert len(expand_grid(load_grid(tmp_path / "g.yaml"))) == 2
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(GridError, match="mapping"):
        load_grid(tmp_path / "bad.yaml")
    with pytest.raises(GridError, match="cannot read"):
        load_grid(tmp_path / "missing.json")


def test_rows_shares_of_best_and_files(tmp_path: Path, trace_file: str) -> None:
    points = [p for p in expand_grid(grid(trace_file)) if p.kv_memory == "2GiB"]
    rows = best_shares([run_point(p) for p in points])
    ok = [r for r in rows if "error" not in r]
    best = max(r["output_tokens_per_s"] for r in ok if r["policy"].startswith("ratio:"))
    for r in ok:
        assert r["share_of_best"] == pytest.approx(r["output_tokens_per_s"] / best)
        assert r["share_sliding"] + r["share_full"] == pytest.approx(1.0)
    bad = run_point(Point("gemma-3-27b", "h100", trace_file, "1KiB", max_seq_len=4096))
    assert "error" in bad and "output_tokens_per_s" not in bad
    paths = write_rows(rows + [bad], tmp_path / "out.json")
    assert [p.name for p in paths] == ["out.json", "out.csv"]
    assert len(json.loads(paths[0].read_text())["points"]) == len(rows) + 1
    with paths[1].open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) + 1 and table[-1]["error"]


def test_serial_fallback_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpool.sim.serial_or_ray as ex

    monkeypatch.setattr(ex, "ray_available", lambda: False)
    out, how = ex.run_all(abs, [-1, -2], workers=4)
    assert out == [1, 2] and "Ray is not installed" in how and "serially" in how
    with pytest.raises(KvpoolError, match="needs Ray"):
        ex.run_all(abs, [1], ray_address="auto")
    with pytest.raises(KvpoolError, match="positive"):
        run_all(abs, [1], workers=0)


def test_cli_serial_sweep_writes_files_and_plot(cli, tmp_path: Path, trace_file: str) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    g = {**grid(trace_file), "kv_memory": "2GiB", "policy": "reference"}
    (tmp_path / "g.json").write_text(json.dumps(g))
    out_base = tmp_path / "res"
    code, out, err = cli(
        "sweep",
        str(tmp_path / "g.json"),
        "--serial",
        "--quiet",
        "--out",
        str(out_base),
        "--plot",
        str(tmp_path / "s.png"),
    )
    assert code == 0, err
    assert "ran 4 points serially" in out and "of best" in out
    assert (tmp_path / "res.csv").exists() and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    code, _, err = cli("sweep", str(tmp_path / "nope.json"))
    assert code == 2 and "cannot read grid" in err
    code, _, err = cli("sweep", str(tmp_path / "g.json"), "--serial", "--workers", "2")
    assert code == 2 and "--serial" in err


@pytest.fixture
def local_ray():  # type: ignore[no-untyped-def]
    """One 2-CPU local Ray for the whole test (run_all reuses a running Ray and
    leaves it running)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.mark.skipif(not ray_available(), reason="Ray is not installed (kvpool[sweep])")
@pytest.mark.slow  # starts a local Ray cluster (15 s)
def test_ray_gives_the_serial_rows(cli, local_ray, trace_file: str) -> None:  # type: ignore[no-untyped-def]
    """Points as tasks on a 2-CPU local Ray: the same rows as in this process,
    in the same order; and `simulate --sweep-ratio --workers 2` prints what
    the serial sweep prints."""
    points = expand_grid(
        {**grid(trace_file), "kv_memory": "2GiB", "policy": "reference", "sweep": {"group": "sliding", "points": 2}}
    )
    serial, how = run_all(run_point, points)
    on_ray, how_ray = run_all(run_point, points, workers=2)
    assert "serially" in how and "Ray tasks" in how_ray and "2 CPUs" in how_ray
    assert on_ray == serial
    assert local_ray.is_initialized()  # not shut down by run_all: it did not start it
    args = [
        "simulate",
        "gemma-3-27b",
        "--gpu",
        "h100",
        "--kv-memory",
        "2GiB",
        "--max-seq-len",
        "4096",
        "--max-batch-size",
        "16",
        "--max-num-tokens",
        "1024",
        "--trace",
        trace_file,
        "--rate",
        "inf",
        "--sweep-ratio",
        "sliding",
        "--sweep-points",
        "2",
        "--compare",
        "reference",
        "--quiet",
        "--json",
    ]
    code, out_serial, err = cli(*args)
    assert code == 0, err
    code, out_ray, err = cli(*args, "--workers", "2")
    assert code == 0, err
    assert json.loads(out_ray) == json.loads(out_serial)
