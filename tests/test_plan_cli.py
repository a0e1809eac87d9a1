"""`kvpool plan`: exit codes, the --json shape, one-line errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvpool.cli.main import main
from kvpool.presets import load_gpu

GiB = 2**30
GEMMA = ["plan", "gemma-4-26b-a4b", "--kv-dtype", "fp8", "--max-seq-len", "32768"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def run_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a command that must fail as a user error: exit 2, one line on stderr."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_json_has_exactly_the_issue_shape(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *GEMMA, "--kv-memory", "60GiB")
    assert set(out) == {
        "policy",
        "kv_dtype",
        "kv_dtype_note",
        "budget_bytes",
        "total_bytes",
        "groups",
        "constraints",
        "guarantees",
        "advice",
        "max_concurrency",
        "warnings",
        "notes",
    }
    assert out["policy"] == "reference" and out["budget_bytes"] == 60 * GiB
    assert isinstance(out["total_bytes"], int) and out["total_bytes"] <= 60 * GiB
    groups = out["groups"]
    assert isinstance(groups, list)
    assert [set(g) for g in groups] == [{"name", "kind", "window", "page_bytes", "pages", "bytes"}] * 2
    assert [(g["name"], g["kind"], g["window"]) for g in groups] == [
        ("sliding", "sliding", 1024),
        ("full", "full", None),
    ]
    assert all(g["bytes"] == g["pages"] * g["page_bytes"] for g in groups)
    assert out["constraints"] == [] and out["warnings"] == [] and out["advice"] is None
    # the default plan holds the engine's warmup and one request at max_seq_len
    assert [(g["name"], g["satisfied"]) for g in out["guarantees"]] == [
        ("warmup_context", True),
        ("warmup_batch", True),
        ("max_seq_len", True),
    ]
    conc = out["max_concurrency"]
    assert isinstance(conc, dict) and set(conc) == {"reference", "avg_seq_len", "max_seq_len"}
    assert conc["avg_seq_len"] is None and conc["reference"] > 256


def test_avg_seq_len_adds_constraints_and_the_gemma_warning(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *GEMMA, "--kv-memory", "60GiB", "--avg-seq-len", "32768")
    assert out["policy"] == "typical_step"
    assert out["constraints"] == [{"name": "context", "satisfied": True, "short": {}}]
    warnings = out["warnings"]
    assert isinstance(warnings, list) and any("sliding" in w for w in warnings)
    conc = out["max_concurrency"]
    assert isinstance(conc, dict) and isinstance(conc["avg_seq_len"], int)


def test_gpu_budget_is_memory_minus_non_kv_times_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    gpu = load_gpu("h100")
    out = run_json(
        capsys, "plan", "llama-3.1-8b-instruct", "--gpu", "h100", "--non-kv-memory", "20GiB", "--memory-fraction", "0.5"
    )
    assert out["budget_bytes"] == int((gpu.memory_bytes - 20 * GiB) * 0.5)
    out = run_json(capsys, "plan", "llama-3.1-8b-instruct", "--gpu", "h100", "--non-kv-memory", "20GiB")
    assert out["budget_bytes"] == int((gpu.memory_bytes - 20 * GiB) * 0.9)


def test_pool_ratio_and_profile_phase(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys, *GEMMA, "--kv-memory", "1GiB", "--avg-seq-len", "4096", "--pool-ratio", "full=0.5,sliding=0.5"
    )
    assert out["policy"] == "pool_ratio" and out["constraints"] == []
    out = run_json(
        capsys, "plan", "llama-3.1-8b-instruct", "--kv-memory", "8GiB", "--phase", "profile", "--max-batch-size", "1024"
    )
    assert out["policy"] == "profile"
    names = [c["name"] for c in out["constraints"]]  # type: ignore[index]
    assert names == ["warmup_context", "warmup_batch", "graph_longest"]
    # 1024 minimal decodes, one 4 MiB page each, are the largest of the three at L = 8192
    assert any("4.00 GiB" in n for n in out["notes"]), out["notes"]  # type: ignore[union-attr]


def test_workload_trace(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, *GEMMA, "--kv-memory", "60GiB", "--workload", "azure-conv")
    assert out["policy"] == "workload"


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*GEMMA, "--kv-memory", "60GiB", "--avg-seq-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "page bytes" in out and "typical step: 8192/0 + 255 x 32768/32767" in out
    assert "warning: group 'sliding'" in out


def test_infeasible_plan_exits_2_with_one_line_naming_group_b_and_l(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = run_error(capsys, "plan", "deepseek-v4-flash", "--kv-memory", "1GiB", "--max-seq-len", "65536")
    assert "'longest_decode'" in err and "group '" in err
    assert "largest max_batch_size that fits" in err and "largest max_seq_len that fits" in err


def test_fit_plans_at_the_length_the_error_names_and_says_so(cli: Any) -> None:
    """--fit used to exit 0 with a plan that holds no request of max_seq_len,
    then exit 2 naming a length; now it takes that length: the plan is the one
    `--max-seq-len` that length gives, and a warning says what was lowered."""
    args = ["plan", "deepseek-v4-flash", "--kv-memory", "4GiB", "--max-batch-size", "8"]
    code, out, err = cli(*args, "--max-seq-len", "1000000")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    length = err.split("largest max_seq_len that fits: ")[1].split(";")[0]
    assert f"pass --fit to plan at max_seq_len {length}" in err
    code, out, err = cli(*args, "--max-seq-len", "1000000", "--fit", "--json")
    assert code == 0, err
    fitted = json.loads(out)
    assert fitted["max_concurrency"]["max_seq_len"] >= 1
    assert any(f"lowered from 1000000 to {length}" in w for w in fitted["warnings"]), fitted["warnings"]
    code, out, err = cli(*args, "--max-seq-len", length, "--json")
    assert code == 0, err
    asked = json.loads(out)
    assert asked["groups"] == fitted["groups"] and asked["warnings"] == fitted["warnings"][:-1]


def test_fit_that_no_length_helps_is_exit_2_with_the_change_that_would(cli: Any) -> None:
    # 256 requests' compressor state alone (12,206,080 B each) need 2.9 GiB: no
    # max_seq_len fits 1 GiB, a smaller batch does
    code, out, err = cli(
        "plan", "deepseek-v4-flash", "--kv-memory", "1GiB", "--max-seq-len", "65536", "--max-batch-size", "256", "--fit"
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "largest max_seq_len that fits: none" in err and "largest max_batch_size that fits: " in err
    best = int(err.split("largest max_batch_size that fits: ")[1].split(";")[0])
    code, out, err = cli(
        "plan", "deepseek-v4-flash", "--kv-memory", "1GiB", "--max-seq-len", "65536", "--max-batch-size", str(best)
    )
    assert code == 0 and "cannot hold" not in out, err + out


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "llama-3.1-8b-instruct"],  # no budget
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--gpu", "h100"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--memory-fraction", "7"],
        ["plan", "deepseek-v4-flash", "--gpu", "h100"],  # no formula, no published count: asks for --non-kv-memory
        ["plan", "llama-3.1-70b", "--gpu", "h100"],  # 70B in bf16 does not fit one H100
        ["plan", "llama-3.1-8b-instruct", "--gpu", "h100", "--non-kv-memory", "1GiB", "--reserved-memory", "1GiB"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--activation-memory", "1GiB"],
        ["plan", "llama-3.1-8b-instruct", "--gpu", "h100", "--non-kv-memory", "200GiB"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "lots"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--avg-seq-len", "9000"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--pool-ratio", "full=0.4"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--pool-ratio", "full"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--cuda-graph-batch-sizes", "1,x"],
        ["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--workload", "nope"],
        ["plan", "no-such-model", "--kv-memory", "1GiB"],
    ],
)
def test_user_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    run_error(capsys, *argv)


def test_bad_flag_values_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "llama-3.1-8b-instruct", "--kv-memory", "1GiB", "--phase", "warm"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_default_length_below_the_models_positions_says_so(cli) -> None:  # type: ignore[no-untyped-def]
    """llama-3.1-8b has 131,072 positions; without --max-seq-len the plan is at
    8,192 and says why, in text and in --json; given, nothing is said."""
    code, out, _ = cli("plan", "llama-3.1-8b-instruct", "--kv-memory", "16GiB")
    assert code == 0 and "note: max_seq_len defaults to 8,192, below the model's 131,072 positions" in out
    code, out, _ = cli("plan", "llama-3.1-8b-instruct", "--kv-memory", "16GiB", "--json")
    assert code == 0 and any("131,072 positions" in n for n in json.loads(out)["notes"])
    code, out, _ = cli("plan", "llama-3.1-8b-instruct", "--kv-memory", "16GiB", "--max-seq-len", "8192")
    assert code == 0 and "defaults to" not in out


def test_plan_text_says_what_each_number_is(cli: Any) -> None:
    """No "S=None", no "in 1 pools", and each count of requests beside its length."""
    code, out, err = cli("plan", "qwen3-8b", "--kv-memory", "4GiB", "--max-seq-len", "4096", "--json")
    counts = json.loads(out)["max_concurrency"]
    code, out, err = cli("plan", "qwen3-8b", "--kv-memory", "4GiB", "--max-seq-len", "4096")
    assert code == 0, err
    assert "None" not in out and " 1 pools" not in out and " in 1 pool " in out
    assert "avg_seq_len not given" in out
    line = next(x for x in out.splitlines() if x.startswith("requests that fit at once"))
    assert line == (
        f"requests that fit at once: {counts['reference']} of 2,049 positions (the reference request), "
        f"{counts['max_seq_len']} of 4,096 (max_seq_len)"
    )


def test_emit_trtllm_is_valid_yaml_alone_on_stdout(cli: Any) -> None:
    """`--emit trtllm > kvpool.yaml` gives the file the note names: the
    plan's tables go to stderr."""
    yaml = pytest.importorskip("yaml")
    code, out, err = cli("plan", "gpt-oss-20b", "--kv-memory", "20GiB", "--engine", "trtllm", "--emit", "trtllm")
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["kv_cache_config"]["max_gpu_total_bytes"] == 20 * GiB
    assert "requests that fit at once" in err and "group" in err


def test_emit_sglang_states_the_fraction_from_the_whole_gpu(cli: Any) -> None:
    """With --gpu the weights are known: SGLang gets --mem-fraction-static, whose
    pools (GPU x F - weights, SGLang's profile_max_num_token) reach the budget, within 0.001 of the GPU."""
    code, out, err = cli("plan", "qwen3-8b", "--gpu", "h100", "--emit", "sglang")
    assert code == 0, err
    line = out.splitlines()[0]
    assert line.startswith("python -m sglang.launch_server") and "leave at least" not in out
    fraction = float(line.split("--mem-fraction-static ")[1].split()[0])
    code, out, err = cli("plan", "qwen3-8b", "--gpu", "h100", "--json")
    memory = json.loads(out)["memory"]
    pools = fraction * memory["gpu_bytes"] - memory["weights_bytes"]
    assert pools - 0.001 * memory["gpu_bytes"] < memory["kv_bytes"] <= pools


@pytest.mark.parametrize(
    ("model", "params"),
    # published totals (model cards, as data/model_params.json cites them): Gemma 4 26B-A4B
    # 25.2B, Qwen3-Next-80B-A3B 80B, Mistral-7B-v0.1 7.24B, all bf16
    [("gemma-4-26b-a4b", 25.2e9), ("qwen3-next-80b-a3b", 80e9), ("mistral-7b-v0.1", 7.24e9)],
)
def test_a_preset_without_a_formula_plans_on_its_published_count(cli: Any, model: str, params: float) -> None:
    """These presets once asked for --weights-memory; their published count, split
    evenly over the ranks, now gives the whole-GPU budget, and says so."""
    code, out, err = cli("plan", model, "--gpu", "h200", "--tp", "4", "--json")
    assert code == 0, err
    memory = json.loads(out)["memory"]
    assert memory["weights_bytes"] == -(-int(params * 2) // 4)
    code, out, err = cli("plan", model, "--gpu", "h200", "--tp", "4")
    assert "split evenly over 4 ranks" in out and "published" in out


def test_tuned_sizing_takes_kv_memory_with_the_gpu_it_times(cli: Any, tmp_path: Any) -> None:
    """--sizing tuned times steps on --gpu, so --kv-memory beside it is no contradiction
    (plan once refused the pair simulate needs); other sizings still refuse it."""
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len,output_len\n" + "".join(f"{300 + 50 * i},{20 + i}\n" for i in range(24)))
    args = ["plan", "gpt-oss-20b", "--kv-memory", "2GiB", "--gpu", "h100", "--workload", str(trace)]
    code, out, err = cli(*args, "--sizing", "tuned", "--max-seq-len", "4096", "--json")
    assert code == 0, err
    assert json.loads(out)["budget_bytes"] == 2 * 2**30
    code, out, err = cli(*args, "--sizing", "occupancy")
    assert code == 2 and "not both" in err
