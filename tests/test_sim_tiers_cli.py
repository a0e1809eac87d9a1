"""`kvpool simulate --host-memory A,B,C`: a sweep over host-tier sizes (JSON,
text, plot), preemption by suspension, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# qwen3-0.6b keeps 28 layers x 8 KV heads x head_dim 128 x (K, V) x 2 bytes = 112 KiB per
# position (its config.json): 1 GiB of KV holds 292 pages of 32 positions, under three prompts of 4,096.
BASE = [
    "--gpu",
    "h100",
    "--kv-memory",
    "1GiB",
    "--max-seq-len",
    "8192",
    "--max-batch-size",
    "8",
    "--tokens-per-block",
    "32",
]
BASE += ["--quiet"]


@pytest.fixture
def conversations(tmp_path: Path) -> str:
    """Three conversations of 8 Mooncake blocks (4,096 tokens), taken in turn
    twice, one request every 20 s: the third evicts the first from the GPU."""
    path = tmp_path / "conv.jsonl"
    rows = []
    for i in range(6):
        conv = i % 3
        rows.append(
            {
                "timestamp": 20000 * i,
                "input_length": 4096,
                "output_length": 4,
                "hash_ids": list(range(100 * conv, 100 * conv + 8)),
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_host_sweep_json_shows_what_each_size_buys(cli, conversations: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(
        "simulate", "qwen3-0.6b", *BASE, "--trace", conversations, "--host-memory", "0,256MiB,1GiB", "--json"
    )
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["host_memory"] for r in runs] == ["0", "256MiB", "1GiB"]
    assert [r["tiers"]["bytes"]["CPU"] for r in runs] == [0, 256 << 20, 1 << 30]  # one rank: tp x pp = 1
    hits = [r["prompt_hit_rate"] for r in runs]
    assert hits == sorted(hits) and hits[2] > hits[0]
    # 1 GiB holds every evicted page: the last three prompts find all but the page of their last token
    tpb = 32  # --tokens-per-block
    assert hits[2] == pytest.approx(3 * (4096 - tpb) / (6 * 4096))
    assert runs[0]["tiers"]["pages_onboarded"] == 0 and runs[2]["tiers"]["pages_onboarded"] > 0
    assert runs[2]["tiers"]["transfer_s"] > 0
    assert runs[2]["ttft_p50_s"] < runs[0]["ttft_p50_s"]  # a copy is cheaper than the prefill it replaces


def sweep(cli, trace: str, *args: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    code, out, err = cli("simulate", "qwen3-0.6b", *BASE, "--trace", trace, *args, "--json")
    assert code == 0, err
    runs: list[dict[str, Any]] = json.loads(out)["runs"]
    return runs


def test_a_disk_tier_alone_or_below_the_host(cli, conversations: str) -> None:  # type: ignore[no-untyped-def]
    """Host 0 with a disk: evicted pages go straight to disk and come back from
    it, at the disk's bandwidth; a host tier that holds them all brings back
    the same pages faster (nothing spills to disk)."""
    alone, host = sweep(cli, conversations, "--host-memory", "0,4GiB", "--disk", "2GiB")
    assert alone["tiers"]["bytes"] == {"DISK": 2 << 30} and host["tiers"]["bytes"] == {"CPU": 4 << 30, "DISK": 2 << 30}
    assert alone["prompt_hit_rate"] == host["prompt_hit_rate"] > 0
    assert alone["tiers"]["pages_onboarded"] == host["tiers"]["pages_onboarded"] > 0
    assert alone["tiers"]["pages_spilled"] == host["tiers"]["pages_spilled"] == 0
    assert alone["tiers"]["transfer_s"] > host["tiers"]["transfer_s"]


def test_a_host_tier_above_a_disk_never_lowers_the_hit_rate(cli, conversations: str) -> None:  # type: ignore[no-untyped-def]
    alone, below = sweep(cli, conversations, "--host-memory", "0,256MiB", "--disk", "2GiB")
    assert below["tiers"]["pages_spilled"] > 0
    assert below["prompt_hit_rate"] >= alone["prompt_hit_rate"]


def test_host_sweep_text_and_plot(cli, conversations: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    plot = tmp_path / "tiers.png"
    code, out, err = cli(
        "simulate", "qwen3-0.6b", *BASE, "--trace", conversations, "--host-memory", "0,1GiB", "--plot", str(plot)
    )
    assert code == 0, err
    assert "pages onboarded" in out and "reference host 1GiB" in out and "63.0 GB/s" in out
    assert plot.stat().st_size > 0


def test_suspend_preemption_runs(cli, conversations: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(
        "simulate",
        "qwen3-0.6b",
        *BASE,
        "--trace",
        conversations,
        "--rate",
        "inf",
        "--host-memory",
        "4GiB",
        "--preemption",
        "suspend",
        "--host-bandwidth",
        "25",
        "--json",
    )
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    assert run["finished"] == 6 and run["tiers"]["preemption"] == "suspend"
    assert run["tiers"]["pages_suspended"] == run["tiers"]["pages_resumed"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preemption", "suspend"], "add --host-memory"),
        (["--host-bandwidth", "20"], "add --host-memory"),
        (["--transfer-overlap"], "--transfer-overlap applies to cold tiers"),
        (["--ranks-per-node", "8"], "--ranks-per-node applies to cold tiers"),
        (["--host-memory", "0,lots"], "cannot read size 'lots'"),
        (["--host-memory", "1GiB,2GiB", "--compare", "reference,typical"], "sweeps one policy"),
        (["--host-memory", "1GiB", "--host-rule", "vllm", "--disk", "-1"], "--disk"),
        (["--disk", "1TiB", "--host-rule", "trtllm"], "sizes the host tier from --host-memory"),
        (["--host-memory", "1GiB", "--policy", "engine:vllm"], "shared pool"),
    ],
)
def test_refusals_are_one_line_and_exit_2(cli, conversations: str, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("simulate", "qwen3-0.6b", *BASE, "--trace", conversations, *args)
    assert code == 2, (out, err)
    assert message in err and err.count("\n") == 1, err
