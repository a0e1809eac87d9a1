"""`kvpool fit`: per engine on one layout, the layouts that hold N users, --json,
--emit-to, and one-line errors. Expected numbers come from the bundled configs'
fields (themselves copied from the published config.json files) and the GPU
table, by hand arithmetic, not from kvpool's functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool import presets

QWEN = ["fit", "qwen3-32b", "--gpu", "h100x2", "--max-seq-len", "32768", "--engine", "all"]


def kv_bytes_per_token(model: str, tp: int) -> int:
    """K and V rows of every layer at bf16 on one of `tp` ranks (GQA heads split by tp)."""
    c = presets.load_model_config(model)
    return int(c["num_hidden_layers"] * 2 * (c["num_key_value_heads"] // tp) * c["head_dim"] * 2)


def test_every_engine_answers_on_one_screen(cli: Any) -> None:
    code, out, err = cli(*QWEN)
    assert code == 0, err
    for name in ("vLLM", "SGLang", "TensorRT-LLM"):
        assert f"\n{name} (" in out
    assert "--gpu-memory-utilization 0.9" in out and "--mem-fraction-static 0." in out
    assert "kv_cache_config.max_gpu_total_bytes:" in out
    assert out.count("launch:") == 3 and out.count("CUDA graphs: batches") == 3
    # "one screen": the per-engine answer is a handful of lines each
    assert len(out.splitlines()) < 60


def test_json_numbers_follow_from_the_config(cli: Any) -> None:
    code, out, err = cli(*QWEN, "--json")
    assert code == 0, err
    fit = json.loads(out)
    assert fit["layout"] == {"tp": 2, "pp": 1, "replicas": 1}
    kv = fit["kv_bytes_per_rank"]
    page = 32 * kv_bytes_per_token("qwen3-32b", 2)  # 32 positions per page
    pages = kv // page
    # the last decode of a request of max_seq_len holds 32768 positions: 1024 pages of 32
    at_max = pages // (32768 // 32)
    # the reference request: 2049 positions -> 65 pages
    at_ref = pages // -(-2049 // 32)
    by_engine = {e["engine"]: e for e in fit["engines"]}
    assert set(by_engine) == {"vllm", "sglang", "trtllm"}
    for e in by_engine.values():
        assert e["verdict"] == "starts" and e["kv_bytes_per_rank"] == kv
        assert e["requests_that_fit"] == {"reference": at_ref, "max_seq_len": at_max}
        assert e["largest_graph_batch"] == 256
    # vLLM's own "Maximum concurrency for 32,768 tokens per request" agrees with the count
    assert int(by_engine["vllm"]["reported"]["max_concurrency"]) == at_max
    # SGLang: pools = G x F - W (model_runner.profile_max_num_token), F rounded up
    memory = fit["memory"]
    flag = by_engine["sglang"]["budget_flags"][0]
    fraction = float(flag.split()[-1])
    assert fraction * memory["gpu_bytes"] - memory["weights_bytes"] >= kv
    assert (fraction - 0.001) * memory["gpu_bytes"] - memory["weights_bytes"] < kv
    assert flag.split()[-1] in by_engine["sglang"]["launch"]
    assert f"kv_cache_config.max_gpu_total_bytes: {kv}" in by_engine["trtllm"]["budget_flags"]
    assert by_engine["trtllm"]["launch"]["kv_cache_config"]["max_gpu_total_bytes"] == kv


def test_fit_budget_is_the_plan_budget(cli: Any) -> None:
    """fit and plan read the same whole-GPU budget for the same layout."""
    code, out, err = cli("plan", "qwen3-32b", "--gpu", "h100", "--tp", "2", "--max-seq-len", "32768", "--json")
    assert code == 0, err
    plan = json.loads(out)
    code, out, err = cli(*QWEN, "--json")
    assert json.loads(out)["kv_bytes_per_rank"] == plan["budget_bytes"]


def test_users_layouts_hold_the_users(cli: Any) -> None:
    code, out, err = cli("fit", "llama-3.1-70b", "--gpu", "h100", "--users", "200", "--len", "8192", "--json")
    assert code == 0, err
    fit = json.loads(out)
    layouts = fit["layouts"]
    assert layouts and all(x["requests_held"] >= 200 for x in layouts)
    assert [x["gpus"] for x in layouts] == sorted(x["gpus"] for x in layouts)
    for x in layouts:
        assert x["gpus"] == x["tp"] * x["pp"] * x["replicas"]
        # what one replica holds follows from its KV per rank, page by page
        page = 32 * kv_bytes_per_token("llama-3.1-70b", x["tp"])
        if x["pp"] == 1:
            assert x["requests_per_replica"] == (x["kv_bytes_per_rank"] // page) // (8192 // 32)
    # 8 GPUs cannot hold them whatever the layout: all their memory at 0.9, less the
    # weights (80 layers of the config's matrices, counted by hand below), is short
    c = presets.load_model_config("llama-3.1-70b")
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv_heads = c["num_key_value_heads"] * c["head_dim"]
    params = layers * (2 * h * h + 2 * h * kv_heads + 3 * h * inter) + 2 * vocab * h
    gpu = presets.load_gpu("h100").memory_bytes
    need = 200 * 8192 * kv_bytes_per_token("llama-3.1-70b", 1)
    assert 8 * 0.9 * gpu - 2 * params < need
    assert min(x["gpus"] for x in layouts) > 8


def test_users_text_ranks_the_layouts(cli: Any) -> None:
    code, out, err = cli("fit", "llama-3.1-70b", "--gpu", "h100", "--users", "200", "--len", "8192", "--engine", "vllm")
    assert code == 0, err
    assert "GPUs  TP  PP  replicas" in out and "fewer GPUs fall short" in out
    assert "vllm serve" in out


def test_emit_to_writes_a_yaml_a_launcher_reads(cli: Any, tmp_path: Path) -> None:
    target = tmp_path / "kvpool.yaml"
    args = ["fit", "qwen3-8b", "--gpu", "h100", "--max-seq-len", "4096", "--engine", "trtllm"]
    code, out, err = cli(*args, "--emit-to", str(target), "--json")
    assert code == 0, err
    config = yaml.safe_load(target.read_text())
    fit = json.loads(out)
    assert config["kv_cache_config"]["max_gpu_total_bytes"] == fit["kv_bytes_per_rank"]
    assert config["max_seq_len"] == 4096 and fit["emitted_to"] == str(target)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "h100", "--engine", "tgi"], "choose from vllm, sglang, trtllm"),
        (["--gpu", "h100", "--engine", "vllm@0.1"], "choose from vllm, sglang, trtllm"),
        (["--gpu", "h100", "--users", "3"], "--users N and --len L together"),
        (["--gpu", "h100", "--users", "3", "--len", "9", "--max-seq-len", "9"], "drop --max-seq-len"),
        (["--gpu", "h100x3", "--tp", "2"], "does not divide 3 GPUs"),
        (["--gpu", "h100", "--users", "3", "--len", "9", "--pool-ratio", "full=1"], "drop --pool-ratio"),
        (["--gpu", "h100", "--users", "3", "--len", "9", "--fit"], "drop --fit"),
        (["--gpu", "h100", "--emit-to", "x.sh"], "give one --engine"),
        (["--gpu", "h100x999"], "at most 64 GPUs"),
        ([], "fit needs --gpu"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli: Any, argv: list[str], message: str) -> None:
    code, out, err = cli("fit", "qwen3-8b", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_nothing_fits_is_exit_2(cli: Any) -> None:
    code, _, err = cli("fit", "llama-3.1-70b", "--gpu", "l40s")  # 131 GiB of weights on one 45 GiB GPU
    assert code == 2 and "no memory left for the KV cache" in err
    code, out, err = cli(
        "fit", "qwen3-8b", "--gpu", "h100x2", "--users", "100000", "--len", "40960"
    )  # 40,960: its positions
    assert code == 2 and "no layout up to 2 GPUs holds 100000" in err and "none" in out


def test_an_engine_kvpool_does_not_model_is_named_not_fatal(cli: Any) -> None:
    """DeepSeek-V4's compressed attention is modelled by no engine: each says so, exit 2."""
    argv = ["fit", "deepseek-v4-flash", "--gpu", "b200x8", "--weights-memory", "40GiB", "--max-seq-len", "65536"]
    code, out, err = cli(*argv, "--json")
    assert code == 2 and "no engine starts" in err
    engines = json.loads(out)["engines"]
    assert [e["verdict"] for e in engines] == ["not modelled"] * 3
    assert all("compressed" in e["reasons"][0] and e["launch"] is None for e in engines)
    code, out, err = cli(*argv, "--engine", "vllm", "--emit-to", "x.sh")
    assert code == 2 and "nothing to emit" in err


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=st.sampled_from(["qwen3-8b", "gemma-3-27b", "gpt-oss-20b", "llama-3.1-8b-instruct"]),
    gpu=st.sampled_from(["h100", "a100", "l40s", "h200"]),
    count=st.sampled_from([1, 2, 4]),
    length=st.integers(2049, 65536),
)
def test_fit_invariants(cli: Any, model: str, gpu: str, count: int, length: int) -> None:
    """Whatever the deployment: every engine that starts holds at least one request of
    max_seq_len and, without a sliding window, no more of them than of the (shorter)
    reference request; SGLang's
    fraction gives its pools K, within 0.001 of the GPU; all engines share the plan's K."""
    gpus = f"{gpu}x{count}" if count > 1 else gpu
    code, out, err = cli("fit", model, "--gpu", gpus, "--max-seq-len", str(length), "--json")
    if code == 2 and not out:  # the weights leave no room on this GPU: one line, nothing else
        assert len(err.strip().splitlines()) == 1
        return
    fit = json.loads(out)
    memory = fit["memory"]
    for e in fit["engines"]:
        assert e["kv_bytes_per_rank"] == fit["kv_bytes_per_rank"]
        if e["verdict"] == "starts":
            counts = e["requests_that_fit"]
            assert counts["max_seq_len"] >= 1
            # past the window a sliding group's need depends on the page offset: the
            # reference request (2049, 2048) sits at the worst one, a decode at 2080 holds
            # one sliding page less, so only models without a window are monotone here
            if model not in ("gemma-3-27b", "gpt-oss-20b"):
                assert counts["max_seq_len"] <= counts["reference"]
            assert e["largest_graph_batch"] <= fit["limits"]["max_batch_size"]
        if e["engine"] == "sglang":
            fraction = float(e["budget_flags"][0].split()[-1])
            pools = fraction * memory["gpu_bytes"] - memory["weights_bytes"]
            assert fit["kv_bytes_per_rank"] <= pools < fit["kv_bytes_per_rank"] + 0.001 * memory["gpu_bytes"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(users=st.integers(1, 400), length=st.sampled_from([2048, 8192, 32768]))
def test_users_layouts_are_the_smallest_that_hold_them(cli: Any, users: int, length: int) -> None:
    """Every layout listed holds the users; every layout tried with fewer GPUs than the
    first listed holds fewer."""
    args = ["fit", "llama-3.1-8b-instruct", "--gpu", "l40s", "--users", str(users), "--len", str(length)]
    code, out, err = cli(*args, "--engine", "vllm", "--json")
    fit = json.loads(out)
    if code == 2:
        assert not fit["layouts"] and "no layout" in err
        return
    first = fit["layouts"][0]["gpus"]
    assert all(x["requests_held"] >= users for x in fit["layouts"])
    assert all(x["requests_held"] < users for x in fit["tried"] if x["gpus"] < first)


def test_engine_names_take_their_release(cli: Any) -> None:
    """`--engine vllm@RELEASE,sglang` as kvpool plan takes it (the newest release by default)."""
    from kvpool.engines.registry import RELEASES

    code, out, err = cli("fit", "qwen3-8b", "--gpu", "h100", "--engine", f"vllm@{RELEASES['vllm'][0]},sglang", "--json")
    assert code == 0, err
    assert [e["engine"] for e in json.loads(out)["engines"]] == ["vllm", "sglang"]


def test_kv_memory_beside_the_gpu_count(cli: Any) -> None:
    """--kv-memory fixes K per rank; --gpu still says how many GPUs (no contradiction in fit)."""
    code, out, err = cli("fit", "qwen3-8b", "--gpu", "h100x2", "--kv-memory", "20GiB", "--json")
    assert code == 0, err
    fit = json.loads(out)
    assert fit["kv_bytes_per_rank"] == 20 * 2**30 and fit["layout"]["tp"] == 2 and fit["memory"] is None
    vllm = next(e for e in fit["engines"] if e["engine"] == "vllm")
    assert vllm["budget_flags"] == [f"--kv-cache-memory-bytes {20 * 2**30}"]


def test_host_memory_gives_each_engine_its_own_host_tier(cli: Any) -> None:
    """1 TiB of host memory on a node of 8 H100s serving qwen3-32b at tp 2 (4 replicas):
    vLLM's --kv-offloading-size is one server's 2 ranks' share (1 TiB / 8 x 2 = 256 GiB),
    SGLang's --hicache-size one rank's in GB (128 GiB = 137.4 GB, floored), and
    TensorRT-LLM V2 provisions min(GPU pool, 1 TiB / 8 x 0.5) bytes (plan/tiers.py)."""
    argv = ["fit", "qwen3-32b", "--gpu", "h100x8", "--tp", "2", "--max-seq-len", "32768", "--host-memory", "1TiB"]
    code, out, err = cli(*argv, "--json")
    assert code == 0, err
    fit = json.loads(out)
    by_engine = {e["engine"]: e for e in fit["engines"]}
    per_rank, kv = 2**40 // 8, fit["kv_bytes_per_rank"]
    page = 32 * kv_bytes_per_token("qwen3-32b", 2)
    assert [t["bytes"] for t in by_engine["vllm"]["tiers"]] == [per_rank]
    assert by_engine["vllm"]["tiers"][0]["pages"] == {"full": per_rank // page}
    assert by_engine["vllm"]["launch"][-2:] == ["--kv-offloading-size", "256"]
    assert [t["bytes"] for t in by_engine["sglang"]["tiers"]] == [per_rank]
    assert "--hicache-size 137 " in by_engine["sglang"]["launch_text"] + " "
    trtllm = by_engine["trtllm"]
    quota = kv // page * page  # the GPU pool's whole pages
    assert trtllm["tiers"][0]["bytes"] == min(quota, per_rank // 2)
    assert trtllm["launch"]["kv_cache_config"]["host_cache_size"] == min(quota, per_rank // 2)
    code, text, err = cli(*argv, "--engine", "vllm")
    assert code == 0 and "host tier: 128.00 GiB per rank" in text


def test_host_rule_and_disk_and_their_dependencies(cli: Any) -> None:
    argv = ["fit", "qwen3-8b", "--gpu", "h100", "--max-seq-len", "8192", "--engine", "vllm,sglang"]
    code, out, err = cli(*argv, "--host-memory", "64GiB", "--host-rule", "even", "--disk", "1TiB", "--json")
    assert code == 0, err
    for e in json.loads(out)["engines"]:  # one GPU, even: the whole 64 GiB; the disk quota per rank as given
        assert [(t["medium"], t["bytes"]) for t in e["tiers"]] == [("CPU", 64 * 2**30), ("DISK", 2**40)]
    for extra, message in (
        (["--host-rule", "even"], "add --host-memory"),
        (["--ranks-per-node", "4"], "add --host-memory"),
    ):
        code, _, err = cli(*argv, *extra)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    code, out, err = cli(*argv, "--json")  # no tier asked for: none
    assert code == 0 and all(e["tiers"] == [] for e in json.loads(out)["engines"])


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "qwen3-32b", "--max-seq-len", "32768"],
        ["warmup", "qwen3-32b", "--max-seq-len", "32768", "--max-batch-size", "8"],
        ["simulate", "qwen3-32b", "--max-seq-len", "32768", "--trace", "azure-code", "--max-requests", "20", "--quiet"],
    ],
)
def test_a_gpu_count_reads_the_same_in_every_command(cli: Any, command: list[str]) -> None:
    """`--gpu h100x2` is two H100s under one engine wherever --gpu is: the same answer as --gpu h100 --tp 2."""
    code, two, err = cli(*command, "--gpu", "h100x2", "--json")
    assert code == 0, err
    code, tp2, err = cli(*command, "--gpu", "h100", "--tp", "2", "--json")
    assert code == 0, err
    assert json.loads(two) == json.loads(tp2)
    code, _, err = cli(*command, "--gpu", "h100x4", "--tp", "3")
    assert code == 2 and "does not divide 4 GPUs" in err
