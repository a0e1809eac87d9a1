"""The smallest fleet for an SLO (`deploy.fleet_fit`): the candidates, the
search's order and stop, the answer and the runner-up, on a fake evaluator
(whose fleets meet the SLO by a rule the test states); bad input."""

from __future__ import annotations

import pytest

from kvpool.deploy.fleet_fit import Evaluation, FleetTask, candidates, choose, fit_fleet
from kvpool.errors import KvpoolError

TRIED: list[str] = []


def fake(task: FleetTask) -> Evaluation:
    """Goodput grows with GPUs, kv beats round-robin, 2 prefill : 2 decode beats all on 4 GPUs;
    the SLO needs goodput 4."""
    c = task.layout
    TRIED.append(c.label)
    good = c.gpus + (0.5 if c.router == "kv" else 0.0) + (1.0 if (c.prefill, c.decode) == (2, 2) else 0.0)
    meets = good >= 4
    return Evaluation(c, meets, () if meets else (f"goodput {good} < 4",), good, 100 * good, {"layout": c.label})


def test_candidates_come_fewest_gpus_first_and_cover_every_split() -> None:
    cs = candidates([1, 2], 4, ["kv", "round-robin"])
    assert [c.gpus for c in cs] == sorted(c.gpus for c in cs)
    four = [c.label for c in cs if c.gpus == 4]
    assert four == [
        "4 x tp1, kv",
        "4 x tp1, round-robin",
        "2 x tp2, kv",
        "2 x tp2, round-robin",
        "1P:3D x tp1, kv",
        "2P:2D x tp1, kv",
        "3P:1D x tp1, kv",
        "1P:1D x tp2, kv",
    ]
    assert len({c for c in cs}) == len(cs)
    assert not [c for c in candidates([1], 3, ["kv"], disaggregated=False) if c.disaggregated]


def test_the_search_stops_at_the_first_gpu_count_that_meets_the_slo() -> None:
    TRIED.clear()
    found = fit_fleet(
        "qwen3-8b",
        gpu="h100",
        trace="azure-conv",
        slo="ttft_p99=2s",
        max_gpus=8,
        tps=[1, 2],
        evaluate=fake,
        max_requests=10,
    )
    assert found.best is not None and found.best.layout.label == "2P:2D x tp1, kv" and found.best.gpus == 4
    assert max(e.gpus for e in found.evaluations) == 4 and len(TRIED) == len(found.evaluations)
    assert found.runner_up is not None and found.runner_up.layout.label == "4 x tp1, kv"
    assert "also meets the SLO on 4 GPUs" in found.why
    assert found.goodput_by_gpus() == [(1, 1.5, False), (2, 2.5, False), (3, 3.5, False), (4, 5.5, True)]
    assert found.to_dict()["best"]["fleet"] == {"layout": "2P:2D x tp1, kv"}


def test_a_lone_winner_is_compared_with_the_best_below_it() -> None:
    evs = [fake(FleetTask(None, c)) for c in candidates([1], 4, ["round-robin"], disaggregated=False)]  # type: ignore[arg-type]
    best, runner, why = choose(evs)
    assert best is not None and best.gpus == 4 and runner is not None and runner.gpus == 3
    assert why == "3 GPUs: misses goodput 3.0 < 4"
    none, near, why = choose(evs[:2])
    assert none is None and near is evs[1] and "misses goodput 2.0 < 4" in why


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"slo": "ttft_p99=2"}, None),
        ({"slo": "fast"}, "METRIC_Q=DURATION"),
        ({"gpu": "h100x2"}, "without a count"),
        ({"max_gpus": 0}, "--max-gpus"),
        ({"routers": ["best"]}, "--router"),
        ({"link": "carrier-pigeon"}, "link"),
        ({"tps": [3]}, None),
    ],
)
def test_bad_input_fails_before_any_run(kw: dict[str, object], message: str | None) -> None:
    TRIED.clear()
    args = {"gpu": "h100", "trace": "azure-conv", "slo": "ttft_p99=2s", "max_gpus": 2, **kw}
    if message is None:  # a good call, for contrast
        if kw.get("tps") == [3]:
            with pytest.raises(KvpoolError):
                fit_fleet("qwen3-8b", evaluate=fake, max_requests=5, **args)  # type: ignore[arg-type]
            return
        assert fit_fleet("qwen3-8b", evaluate=fake, max_requests=5, **args).evaluations  # type: ignore[arg-type]
        return
    with pytest.raises(KvpoolError, match=message):
        fit_fleet("qwen3-8b", evaluate=fake, max_requests=5, **args)  # type: ignore[arg-type]
    assert not TRIED
