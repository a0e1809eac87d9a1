"""`kvpool simulate --replicas/--router/--prefill-replicas ...` and `kvpool fit
--trace --slo`: bad input is one line and exit 2, before any run."""

from __future__ import annotations

import json

import pytest

SIM = ("simulate", "qwen3-8b", "--gpu", "h100", "--trace", "azure-conv", "--max-requests", "20")
FIT = ("fit", "qwen3-8b", "--gpu", "h100")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((*SIM, "--replicas", "2", "--router", "best"), "invalid choice"),
        ((*SIM, "--replicas", "0"), "--replicas"),
        ((*SIM, "--replicas", "2", "--event-lag-ms", "5"), "reads none"),
        ((*SIM, "--router", "kv", "--event-lag-ms", "-1"), "--event-lag-ms: expected a finite number >= 0"),
        ((*SIM, "--prefill-replicas", "1"), "both --prefill-replicas and --decode-replicas"),
        ((*SIM, "--replicas", "3", "--prefill-replicas", "1", "--decode-replicas", "1"), "not both"),
        ((*SIM, "--replicas", "2", "--link", "ib-ndr"), "handoff"),
        ((*SIM, "--prefill-replicas", "1", "--decode-replicas", "1", "--link", "smoke"), "link"),
        ((*SIM, "--replicas", "2", "--compare", "reference,typical"), "one policy"),
        ((*SIM, "--replicas", "2", "--slo", "ttft=2s"), "METRIC_Q=DURATION"),
        ((*SIM, "--replicas", "2", "--kv-events", "tcp://127.0.0.1:5557"), "drop it"),
        ((*FIT, "--slo", "ttft_p99=2s"), "both --trace and --slo"),
        ((*FIT, "--trace", "azure-conv"), "both --trace and --slo"),
        ((*FIT, "--trace", "azure-conv", "--slo", "ttft_p99=2s", "--users", "4", "--len", "100"), "drop them"),
        (("fit", "qwen3-8b", "--gpu", "h100x2", "--trace", "azure-conv", "--slo", "ttft_p99=2s"), "without a count"),
        ((*FIT, "--trace", "azure-conv", "--slo", "ttft_p99=2s", "--routers", "kv,nope"), "--router"),
        ((*FIT, "--trace", "nope.csv", "--slo", "ttft_p99=2s"), "nope.csv"),
        ((*FIT, "--max-gpus", "4"), "--max-gpus is the fleet search's"),
        ((*FIT, "--routers", "kv"), "--routers is the fleet search's"),
    ],
)
def test_bad_fleet_options_are_one_line_and_exit_2(cli, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_a_fleet_prints_its_replicas_and_json_has_every_number(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = (*SIM, "--max-seq-len", "16384", "--replicas", "2", "--router", "kv", "--quiet")
    code, out, err = cli(*args, "--slo", "ttft_p99=2s", "--plot", str(tmp_path / "f.png"))
    assert code == 0, err
    assert "aggregated 0" in out and "aggregated 1" in out and "2 x tp1, kv" in out and "SLO ttft_p99=2s" in out
    assert (tmp_path / "f.png").stat().st_size > 0
    code, out, _ = cli(*args, "--json")
    data = json.loads(out)
    assert code == 0 and data["layout"] == "2 x tp1, kv" and len(data["replicas"]) == 2
    assert sum(r["requests"] for r in data["replicas"]) == data["requests"] - data["too_long"] == 20
    assert set(data["latency_s"]) == {"ttft", "itl", "e2e"} and 0 <= data["prompt_hit_rate"] <= 1


def test_a_disaggregated_fleet_runs_beside_its_aggregated_twin(cli) -> None:  # type: ignore[no-untyped-def]
    args = (*SIM, "--prefill-replicas", "1", "--decode-replicas", "1", "--link", "ib-ndr", "--quiet", "--json")
    code, out, err = cli(*args)
    assert code == 0, err
    data = json.loads(out)
    assert data["layout"] == "1P:1D x tp1, round-robin" and data["aggregated"]["layout"] == "2 x tp1, round-robin"
    assert data["verdict"].startswith(("aggregated wins", "disaggregated wins"))
    decode = [r for r in data["replicas"] if r["role"] == "decode"][0]
    assert decode["transfer_peak_pages"]["full"] > 0


def test_the_fleet_search_answers_and_plots(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = (*FIT, "--trace", "azure-conv", "--max-requests", "20", "--rate", "20", "--slo", "ttft_p99=1s")
    code, out, err = cli(
        *args, "--max-gpus", "2", "--routers", "round-robin", "--quiet", "--plot", str(tmp_path / "g.png")
    )
    assert code == 0, err
    assert "smallest fleet for ttft_p99=1s: 1 x tp1, round-robin on 1 GPUs" in out
    assert (tmp_path / "g.png").stat().st_size > 0
    code, out, err = cli(*args, "--slo", "ttft_p99=1ms", "--max-gpus", "1", "--no-disaggregated", "--quiet")
    assert code == 2 and "no fleet of at most 1 GPUs meets" in err and "nothing tried meets" in out
