"""`kvpool.deploy`: the deployment pipeline as library calls. Each function's
result, as a dict, is what its command prints with --json (the CLI parses and
prints; the library computes), and bad input is a typed exception, not an exit."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import kvpool
from kvpool import deploy, presets
from kvpool.errors import KvpoolError, LimitsError
from kvpool.trace import Trace


def cli_json(cli: Any, *argv: str) -> Any:
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_fit_is_the_cli_json(cli: Any) -> None:
    found = deploy.fit("qwen3-32b", gpu="h100x2", max_seq_len=32768, engines="all")
    expected = cli_json(cli, "fit", "qwen3-32b", "--gpu", "h100x2", "--max-seq-len", "32768", "--engine", "all")
    assert found.to_dict() == expected
    assert found.error is None and [e.engine for e in found.engines] == ["vllm", "sglang", "trtllm"]
    # two GPUs under one engine: tensor parallelism 2, each rank half the KV heads (K and V, bf16)
    assert found.resolved is not None and found.resolved.request.model.tp == 2
    c = presets.load_model_config("qwen3-32b")
    half = c["num_hidden_layers"] * 2 * (c["num_key_value_heads"] // 2) * c["head_dim"] * 2
    assert found.resolved.spec.groups[0].row_bytes == half


def test_fit_users_is_the_cli_json(cli: Any) -> None:
    found = deploy.fit("llama-3.1-70b", gpu="h100", users=200, length=8192, engines=["vllm"])
    expected = cli_json(
        cli, "fit", "llama-3.1-70b", "--gpu", "h100", "--users", "200", "--len", "8192", "--engine", "vllm"
    )
    assert found.to_dict() == expected
    assert found.search is not None and found.search.best is not None
    assert found.search.best.holds >= 200 and all(x.holds < 200 for x in found.search.tried)


def test_fit_that_does_not_fit_is_an_answer_not_an_exception(cli: Any) -> None:
    found = deploy.fit("llama-3.1-70b", gpu="h100x2", users=500, length=32768, engines="vllm")
    assert found.error == "no layout up to 2 GPUs holds 500 requests of 32768 positions"
    code, out, err = cli(
        "fit", "llama-3.1-70b", "--gpu", "h100x2", "--users", "500", "--len", "32768", "--engine", "vllm", "--json"
    )
    assert code == 2 and found.error in err and json.loads(out) == found.to_dict()


@pytest.mark.parametrize(
    ("keywords", "argv"),
    [
        (
            {"kv_memory": "60GiB", "kv_dtype": "fp8", "max_seq_len": 32768},
            ["gemma-4-26b-a4b", "--kv-memory", "60GiB", "--kv-dtype", "fp8", "--max-seq-len", "32768"],
        ),
        (
            {"gpu": "h100", "tp": 4, "kv_dtype": "fp8", "max_seq_len": 8192, "engine": "sglang"},
            ["llama-3.1-70b", "--gpu", "h100", "--tp", "4", "--kv-dtype", "fp8", "--max-seq-len", "8192"]
            + ["--engine", "sglang"],
        ),
        (
            {"gpu": "h100x2", "engine": "vllm", "emit": "sglang"},
            ["qwen3-32b", "--gpu", "h100x2", "--engine", "vllm", "--emit", "sglang"],
        ),
        (
            {"kv_memory": 16 * 2**30, "host_memory": "256GiB", "disk": "1TiB", "engine": "sglang"},
            ["qwen3-8b", "--kv-memory", "16GiB", "--host-memory", "256GiB", "--disk", "1TiB", "--engine", "sglang"],
        ),
        (
            {"kv_memory": "60GiB", "kv_dtype": "fp8", "workload": "azure-conv", "sizing": "occupancy"},
            ["gemma-4-26b-a4b", "--kv-memory", "60GiB", "--kv-dtype", "fp8", "--workload", "azure-conv"]
            + ["--sizing", "occupancy"],
        ),
    ],
)
def test_plan_is_the_cli_json(cli: Any, keywords: dict[str, Any], argv: list[str]) -> None:
    found = deploy.plan(argv[0], **keywords)
    assert found.to_dict() == cli_json(cli, "plan", *argv)


def test_plan_on_two_gpus_is_the_plan_at_tp_2(cli: Any) -> None:
    """`--gpu h100x2` reads as two GPUs under one engine wherever --gpu is."""
    two = deploy.plan("qwen3-32b", gpu="h100x2", max_seq_len=32768)
    assert two.to_dict() == deploy.plan("qwen3-32b", gpu="h100", tp=2, max_seq_len=32768).to_dict()
    assert two.resolved.request.model.tp == 2 and two.resolved.request.replicas == 1
    assert two.to_dict() == cli_json(cli, "plan", "qwen3-32b", "--gpu", "h100x2", "--max-seq-len", "32768")


SIM = ["qwen3-8b", "--gpu", "h100", "--kv-memory", "4GiB", "--max-seq-len", "16384", "--trace", "azure-conv"]


def test_simulate_is_the_cli_json(cli: Any) -> None:
    found = deploy.simulate(
        "qwen3-8b",
        gpu="h100",
        kv_memory="4GiB",
        max_seq_len=16384,
        trace="azure-conv",
        max_requests=120,
        rate=float("inf"),
        compare="reference,engine:vllm",
    )
    argv = [*SIM, "--max-requests", "120", "--rate", "inf", "--compare", "reference,engine:vllm", "--quiet"]
    assert found.to_dict() == cli_json(cli, "simulate", *argv)
    assert [r.policy for r in found.runs] == ["reference", "engine:vllm"]
    assert all(r.finished + r.rejected == 120 for r in found.runs)


def test_simulate_with_host_sizes_is_the_cli_json(cli: Any) -> None:
    found = deploy.simulate(
        "qwen3-8b",
        gpu="h100",
        kv_memory="4GiB",
        max_seq_len=16384,
        trace="mooncake-conv",
        max_requests=20,
        rate=4.0,
        host_memory=[0, "64GiB"],
    )
    argv = [*SIM[:-1], "mooncake-conv", "--max-requests", "20", "--rate", "4", "--host-memory", "0,64GiB", "--quiet"]
    assert found.to_dict() == cli_json(cli, "simulate", *argv)
    assert found.host_sizes == ("0", "64GiB")


def test_simulate_takes_a_trace_value() -> None:
    """A notebook's own requests: a `Trace`, not a file."""
    trace = Trace("mine", np.full(8, 1000, dtype=np.int64), np.full(8, 50, dtype=np.int64))
    found = deploy.simulate("qwen3-8b", gpu="h100", kv_memory="4GiB", trace=trace, rate=float("inf"))
    (run,) = found.runs
    assert run.finished == 8 and run.output_tokens == 8 * 50


def test_one_simulation_set_up_runs_twice_the_same() -> None:
    setup = deploy.Simulation.of("qwen3-8b", gpu="h100", kv_memory="4GiB", trace="azure-code", max_requests=40)
    first, second = setup.run(), setup.run()
    assert first.to_dict() == second.to_dict()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: deploy.fit("qwen3-8b", gpu="h100", max_batch_size=0), LimitsError, "--max-batch-size"),
        (lambda: deploy.fit("qwen3-8b", gpu="h100", max_seq_len=0), KvpoolError, "max_seq_len must be a positive"),
        (lambda: deploy.fit("qwen3-8b", gpu="h100", bogus=1), KvpoolError, "unknown option(s) bogus"),  # type: ignore[call-arg]
        (lambda: deploy.fit("qwen3-8b", gpu="nope"), KvpoolError, "unknown gpu preset 'nope'"),
        (lambda: deploy.fit("qwen3-8b", gpu="h100", users=10), KvpoolError, "--users N and --len L together"),
        (lambda: deploy.fit("qwen3-8b", gpu="h100x3", tp=2), KvpoolError, "does not divide 3 GPUs"),
        (lambda: deploy.fit("qwen3-8b", gpu="h100", tp="2"), KvpoolError, "--tp must be a positive integer"),  # type: ignore[arg-type]
        (lambda: deploy.plan("qwen3-8b"), KvpoolError, "no KV budget"),
        (lambda: deploy.plan("qwen3-8b", kv_memory="4GiB", sizing="fast"), KvpoolError, "--sizing 'fast'"),  # type: ignore[arg-type]
        (
            lambda: deploy.simulate("qwen3-8b", gpu="h100x4", tp=2, kv_memory="4GiB", trace="azure-conv"),
            KvpoolError,
            "one replica",
        ),
        (
            lambda: deploy.simulate("qwen3-8b", gpu="h100", kv_memory="4GiB", trace="azure-conv", compare=""),
            KvpoolError,
            "--compare is empty",
        ),
    ],
)
def test_bad_input_is_a_typed_error_naming_the_option(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)


def test_import_kvpool_stays_the_numpy_core() -> None:
    """`import kvpool` loads neither the pipeline nor the simulator; `kvpool.deploy` loads on first use."""
    code = (
        "import sys, kvpool; assert 'kvpool.deploy' not in sys.modules and 'kvpool.sim' not in sys.modules; "
        "assert kvpool.deploy.fit.__module__ == 'kvpool.deploy.fitting'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert kvpool.deploy is deploy
    for name in kvpool.__all__:  # each public name resolves to its own module's object
        value = getattr(kvpool, name)
        assert getattr(importlib.import_module(value.__module__), name) is value, name
    with pytest.raises(AttributeError):
        _ = kvpool.no_such_name  # type: ignore[attr-defined]


def test_the_command_loads_numpy_after_choosing_its_blas_threads() -> None:
    """`kvpool` and `kvpool.cli.main` load no NumPy: the command sets OpenBLAS's
    thread count (cli/main.py) before its subcommand loads NumPy, which reads it
    once; the garbage collector it paused and froze is back as it was after it."""
    code = (
        "import sys, os, kvpool, kvpool.cli.main; assert 'numpy' not in sys.modules; "
        "os.environ.pop('OPENBLAS_NUM_THREADS', None); "
        "assert kvpool.cli.main.main(['gpus', '--json']) == 0; "
        "assert 'numpy' in sys.modules and os.environ['OPENBLAS_NUM_THREADS'] == '1'; "
        "import gc; assert gc.isenabled() and gc.get_freeze_count() == 0  # the collector back whole"
    )
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)


def test_deploy_and_fleet_load_each_name_on_first_use() -> None:
    """`kvpool simulate` of one replica loads the simulation's modules alone: no fit
    search, fleet loop, calibration or KV index; every public name still resolves."""
    code = (
        "import sys, kvpool.cli.simulate_cmd; "
        "heavy = [m for m in ('kvpool.deploy.fitting', 'kvpool.deploy.fleets', 'kvpool.deploy.calibrating', "
        "'kvpool.fleet.loop', 'kvpool.fleet.metrics') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import kvpool.fleet

    for package in (deploy, kvpool.fleet):
        for name in package.__all__:
            value = getattr(package, name)
            assert getattr(value, "__module__", package.__name__).startswith(package.__name__), name
    assert kvpool.fleet.handoff.__module__ == "kvpool.fleet.handoff" and callable(kvpool.fleet.handoff)
    with pytest.raises(AttributeError):
        _ = deploy.no_such_name  # type: ignore[attr-defined]
