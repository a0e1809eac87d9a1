"""`kvpool simulate --replicas/--router/--prefill-replicas ...` and `kvpool fit
--trace --slo`: bad input is one line and exit 2, before any run."""

from __future__ import annotations

import pytest

SIM = ("simulate", "qwen3-8b", "--gpu", "h100", "--trace", "azure-conv", "--max-requests", "20")
FIT = ("fit", "qwen3-8b", "--gpu", "h100")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((*SIM, "--replicas", "2", "--router", "best"), "invalid choice"),
        ((*SIM, "--replicas", "0"), "--replicas"),
        ((*SIM, "--replicas", "2", "--event-lag-ms", "5"), "reads none"),
        ((*SIM, "--router", "kv", "--event-lag-ms", "-1"), "must not be negative"),
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
    ],
)
def test_bad_fleet_options_are_one_line_and_exit_2(cli, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err
