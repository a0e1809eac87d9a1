"""`kvpool simulate`: JSON shape, policies, sweep, plot, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RUN_KEYS = {
    "policy",
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "preemptions",
    "graph_step_share",
    "pages",
    # every number the table shows
    "tpot_p99_s",
    "padding_failures",
    "reuse_hit_rate",
    "prompt_hit_rate",  # what routers and Dynamo's mocker report, beside the manager's own
    "finished",
    "num_requests",
    "rejected",
    "shared_pool",
}


@pytest.fixture
def small_trace(tmp_path: Path) -> str:
    path = tmp_path / "small.csv"
    rows = [f"{200 + 37 * i % 900},{5 + 13 * i % 60},{0.01 * i:.2f}" for i in range(40)]
    path.write_text("prompt_len,output_len,arrival_s\n" + "\n".join(rows) + "\n")
    return str(path)


BASE = [
    "--gpu",
    "h100",
    "--kv-memory",
    "4GiB",
    "--max-seq-len",
    "4096",
    "--max-batch-size",
    "16",
    "--max-num-tokens",
    "1024",
    "--quiet",
]


def test_json_has_exactly_the_issue_shape(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("simulate", "qwen3-0.6b", *BASE, "--trace", small_trace, "--json")
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert len(runs) == 1 and set(runs[0]) == RUN_KEYS
    run = runs[0]
    assert run["policy"] == "reference" and run["output_tokens_per_s"] > 0
    assert set(run["pages"]) == {"full"} and set(run["pages"]["full"]) == {"total", "peak_used", "mean_used"}
    assert 0 <= run["graph_step_share"] <= 1


def test_json_holds_every_number_of_the_table(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    """Each cell of the text table can be rebuilt from the run's JSON."""
    args = ("simulate", "gemma-3-27b", *BASE, "--trace", small_trace)
    code, text, err = cli(*args)
    assert code == 0, err
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    run = json.loads(out)["runs"][0]
    lines = text.splitlines()
    header = lines[1].split("  ")
    header = [h.strip() for h in header if h.strip()]
    cells = lines[3].split()
    row = dict(zip(header, cells, strict=True))
    pages = run["pages"]
    assert row["tok/s"] == f"{run['output_tokens_per_s']:,.0f}"
    assert row["TPOT p99 ms"] == f"{run['tpot_p99_s'] * 1e3:,.1f}"
    assert row["TTFT p99 s"] == f"{run['ttft_p99_s']:,.2f}"
    assert row["pad fails"] == str(run["padding_failures"])
    assert row["done"] == f"{run['finished']}/{run['num_requests']}"
    for g, u in pages.items():
        assert row[f"{g} pages"] == f"{u['total']:,}"
        assert row[f"{g} peak/mean"] == f"{u['peak_used'] / u['total']:.0%}/{u['mean_used'] / u['total']:.0%}"


def test_compare_runs_policies_side_by_side(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(
        "simulate",
        "gemma-3-27b",
        *BASE,
        "--trace",
        small_trace,
        "--rate",
        "inf",
        "--compare",
        "reference,typical,workload,ratio:full=0.5",
        "--json",
    )
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["policy"] for r in runs] == ["reference", "typical", "workload", "ratio:full=0.5"]
    # typical without --avg-seq-len falls back to S = L: more full-attention pages
    assert runs[1]["pages"]["full"]["total"] > runs[0]["pages"]["full"]["total"]


def test_text_output_and_sweep_with_plot(cli, small_trace: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    code, out, err = cli(
        "simulate",
        "gemma-3-27b",
        *BASE,
        "--trace",
        small_trace,
        "--rate",
        "inf",
        "--sweep-ratio",
        "sliding",
        "--sweep-points",
        "3",
        "--plot",
        str(png),
    )
    assert code == 0, err
    assert "best split: " in out and "of the best" in out
    for policy in ("reference", "typical", "workload"):
        assert f"\n  {policy}: " in out
    assert "ratio:sliding=0.05" in out and "ratio:sliding=0.95" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_json_adds_one_run_per_share(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli(
        "simulate",
        "gemma-3-27b",
        *BASE,
        "--trace",
        small_trace,
        "--rate",
        "inf",
        "--policy",
        "reference",
        "--sweep-ratio",
        "full",
        "--sweep-points",
        "2",
        "--json",
    )
    assert code == 0
    names = [r["policy"] for r in json.loads(out)["runs"]]
    assert names == ["reference", "ratio:full=0.05", "ratio:full=0.95"]


def test_no_padding_reservation_flag(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("simulate", "qwen3-0.6b", *BASE, "--trace", small_trace, "--no-padding-reservation")
    assert code == 0 and "padding dummies lazy" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-memory", "1GiB"], "needs --gpu"),
        (["--gpu", "h100", "--kv-memory", "1GiB", "--rate", "fast"], "cannot read --rate"),
        (["--gpu", "h100", "--kv-memory", "1GiB", "--rate", "0"], "must be positive"),
        (["--gpu", "h100", "--kv-memory", "1GiB", "--policy", "best"], "unknown policy"),
        (["--gpu", "h100", "--kv-memory", "1GiB", "--policy", "ratio:full"], "cannot read policy"),
        (["--gpu", "h100", "--kv-memory", "1GiB", "--sweep-ratio", "sliding"], "no group 'sliding'"),
        (["--gpu", "h200x", "--kv-memory", "1GiB"], "unknown gpu preset"),
    ],
)
def test_errors_are_one_line_and_exit_2(cli, small_trace: str, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("simulate", "qwen3-0.6b", "--trace", small_trace, "--quiet", *args)
    assert code == 2, (out, err)
    assert message in err and err.count("\n") == 1, err


def test_unknown_trace_and_model_without_weights(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli("simulate", "qwen3-0.6b", *BASE, "--trace", "azure-chat")
    assert code == 2 and "neither a bundled trace" in err
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_size": 64,
                "max_position_embeddings": 4096,
            }
        )
    )
    code, _, err = cli("simulate", str(config), *BASE, "--trace", "azure-code", "--max-requests", "5")
    assert code == 2 and "--weights-bytes" in err
    code, out, err = cli(
        "simulate",
        str(config),
        *BASE,
        "--trace",
        "azure-code",
        "--max-requests",
        "5",
        "--weights-bytes",
        "1GB",
        "--json",
    )
    assert code == 0, err


def test_pool_ratio_flag_is_a_ratio_policy(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(
        "simulate", "gemma-3-27b", *BASE, "--trace", small_trace, "--pool-ratio", "full=0.4,sliding=0.6", "--json"
    )
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert run["policy"] == "ratio:full=0.4,sliding=0.6"


@pytest.mark.parametrize(
    "args",
    [
        ["--sweep-ratio", "nope"],  # unknown group
        ["--plot", "/tmp/kvpool-plot.txt"],  # a type matplotlib cannot write
        ["--plot", "/nonexistent-folder/plot.png"],
        [
            "--compare",
            "reference,typical",
            "--avg-seq-len",
            "4096",  # typical's context floor
            "--max-num-tokens",
            "1000000",
            "--max-seq-len",
            "1000000",
        ],  # cannot fit 1 GiB
    ],
)
def test_bad_sweep_group_or_infeasible_policy_fails_before_any_run(  # type: ignore[no-untyped-def]
    cli, small_trace: str, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    import kvpool.deploy.simulation as cmd

    def no_run(*a: object, **k: object) -> None:
        raise AssertionError("a simulation ran before the bad input was reported")

    monkeypatch.setattr(cmd, "simulate_plan", no_run)
    code, out, err = cli(
        "simulate", "gemma-3-27b", "--gpu", "h100", "--kv-memory", "1GiB", "--trace", small_trace, "--quiet", *args
    )
    assert code == 2 and out == "" and err.count("\n") == 1, err


def test_policy_flags_that_would_override_each_other_are_refused(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    for extra in (
        ["--policy", "typical", "--pool-ratio", "full=0.5"],
        ["--compare", "reference,typical", "--policy", "workload"],
    ):
        code, out, err = cli("simulate", "gemma-3-27b", *BASE, "--trace", small_trace, *extra)
        assert code == 2 and out == "" and "give one of" in err and err.count("\n") == 1, err


def test_pool_ratio_is_checked_as_in_plan(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("simulate", "gemma-3-27b", *BASE, "--trace", small_trace, "--pool-ratio", "sliding=0.3")
    assert code == 2 and "a share for each group" in err and err.count("\n") == 1, err


def test_help_names_the_calibrated_step_times_as_the_default(cli) -> None:  # type: ignore[no-untyped-def]
    """The default step times are the GPU's shipped calibrated profile; roofline is only the opt-in."""
    code, out, _ = cli("simulate", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "roofline step-time model" not in text
    assert "calibrated on measured GPU kernels (the GPU's shipped profile" in text
    assert "default: the shipped profile of --gpu" in text
    # every mention of roofline is the --calibration value that asks for it
    assert text.count("roofline") == text.count("--calibration roofline") + text.count("FILE|roofline") + text.count(
        "'roofline' for the uncalibrated"
    )


def test_no_reuse_flag_recomputes_preempted_requests_from_their_first_token(cli, small_trace: str) -> None:  # type: ignore[no-untyped-def]
    tight = [a if a != "4GiB" else "160MiB" for a in BASE]  # ~1,400 tokens of qwen3-0.6b KV: preempts
    runs = {}
    for flag in ([], ["--no-reuse"]):
        code, out, err = cli("simulate", "qwen3-0.6b", *tight, "--trace", small_trace, "--json", *flag)
        assert code == 0, err
        runs[bool(flag)] = json.loads(out)["runs"][0]
    on, off = runs[False], runs[True]
    assert on["preemptions"] > 0 and off["preemptions"] > 0
    assert on["reuse_hit_rate"] > 0  # readmitted victims find their own pages (no prompt shares any)
    assert on["prompt_hit_rate"] == off["reuse_hit_rate"] == 0
    hashed = ["--trace", "mooncake-conv", "--max-requests", "5"]
    code, _, err = cli("simulate", "qwen3-0.6b", *BASE, *hashed, "--no-reuse", "--hash-lookahead", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--no-reuse" in err
    code, _, err = cli("simulate", "qwen3-0.6b", *BASE, "--trace", small_trace, "--no-reuse", "--policy", "online")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "online" in err
