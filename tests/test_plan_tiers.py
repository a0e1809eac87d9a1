"""Sizing cold tiers per rank (plan/tiers.py): each engine's rule for its host
tier, and a tier's pages per group in the GPU plan's proportions, never over
its bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import hybrid_spec, twin_spec
from kvpool.engines.host_tiers import host_tier_bytes
from kvpool.errors import LimitsError
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.plan.tiers import GB, GiB, plan_tiers, tier_pages


@settings(max_examples=100, deadline=None)
@given(full=st.integers(1, 10_000), sliding=st.integers(1, 10_000), tier_gib=st.integers(0, 512))
def test_a_tier_keeps_the_gpu_proportions_within_its_bytes(full: int, sliding: int, tier_gib: int) -> None:
    plan = PoolPlan.from_pages(twin_spec(tpb=16), {"full": full, "sliding": sliding}, ServingLimits())
    pages = tier_pages(plan, tier_gib * GiB)
    used = sum(plan.group(g).page_bytes * n for g, n in pages.items())
    assert used <= tier_gib * GiB
    gpu = sum(g.bytes for g in plan.groups)
    for g in plan.groups:  # floor of the group's share: at most one page below the exact proportion
        exact = g.pages * tier_gib * GiB / gpu
        assert exact - 1 < pages[g.name] <= exact


def test_each_engine_sizes_its_host_tier_by_its_own_rule() -> None:
    # TensorRT-LLM V2: min(GPU quota 40 GiB, 512 GiB / 8 ranks x 0.5 = 32 GiB, memlock 30 GiB x 0.8 = 24 GiB)
    assert host_tier_bytes("trtllm", gpu_kv_bytes=40 * GiB, host_memory=512 * GiB, ranks_per_node=8)[0] == 32 * GiB
    got = host_tier_bytes("trtllm", gpu_kv_bytes=40 * GiB, host_memory=512 * GiB, ranks_per_node=8, memlock=30 * GiB)
    assert got[0] == int(30 * GiB * 0.8)
    # vLLM: --kv-offloading-size is the whole server's; TP 4 x PP 1 ranks hold a quarter each
    assert host_tier_bytes("vllm", gpu_kv_bytes=0, offloading_gib=64, kv_ranks=4)[0] == 16 * GiB
    # SGLang: --hicache-size in GB per rank, else --hicache-ratio x the device pool
    assert host_tier_bytes("sglang", gpu_kv_bytes=10 * GiB, hicache_gb=100)[0] == 100 * GB
    assert host_tier_bytes("sglang", gpu_kv_bytes=10 * GiB)[0] == 20 * GiB
    assert host_tier_bytes("even", gpu_kv_bytes=0, host_memory=256 * GiB, ranks_per_node=8)[0] == 32 * GiB


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rule": "trtllm"},
        {"rule": "vllm"},
        {"rule": "vllm", "offloading_gib": -1.0},
        {"rule": "sglang", "hicache_ratio": 0.0},
        {"rule": "even"},
        {"rule": "even", "host_memory": 1, "ranks_per_node": 0},
        {"rule": "lmcache", "host_memory": 1},
    ],
)
def test_a_rule_without_what_it_needs_is_refused_by_name(kwargs: dict[str, object]) -> None:
    with pytest.raises(LimitsError):
        host_tier_bytes(gpu_kv_bytes=GiB, **kwargs)  # type: ignore[arg-type]


def test_plan_tiers_lists_host_then_disk_with_pages_per_group() -> None:
    spec = hybrid_spec(tpb=16)
    plan = PoolPlan.from_pages(spec, {"full": 100, "sliding": 100, "linear_state": 10}, ServingLimits())
    tiers = plan_tiers(plan, 4 * GiB, 16 * GiB, "even")
    assert [t.medium for t in tiers] == ["CPU", "DISK"]
    assert tiers[1].pages == tier_pages(plan, 16 * GiB)
    assert plan_tiers(plan, None, 0, "even") == []


def test_plan_prints_each_tier_per_rank_as_json_and_text(cli: Any) -> None:
    # gemma-3-27b on 20 GiB of GPU KV, 256 GiB of host memory over 8 ranks: 32 GiB per rank, split
    # between the sliding and full pools in the GPU plan's proportions
    code, out, _ = cli(
        "plan",
        "gemma-3-27b",
        "--kv-memory",
        "20GiB",
        "--host-memory",
        "256GiB",
        "--ranks-per-node",
        "8",
        "--disk",
        "64GiB",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    host, disk = data["tiers"]
    assert (host["medium"], host["bytes"], disk["medium"], disk["bytes"]) == ("CPU", 32 * GiB, "DISK", 64 * GiB)
    gpu = {p["name"]: p for p in data["groups"]}
    gpu_bytes = sum(p["page_bytes"] * p["pages"] for p in gpu.values())
    for name, pages in host["pages"].items():
        assert pages == gpu[name]["pages"] * 32 * GiB // gpu_bytes
    code, out, _ = cli(
        "plan", "gemma-3-27b", "--kv-memory", "20GiB", "--host-memory", "256GiB", "--ranks-per-node", "8"
    )
    assert code == 0 and "cold tiers per rank" in out and "host memory / 8 ranks per node" in out


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["--host-memory", "lots"], "--host-memory"),
        (["--disk", "-1GiB"], "--disk"),
        (["--host-memory", "1TiB", "--ranks-per-node", "0"], "ranks-per-node"),
        (["--host-rule", "lmcache"], "host-rule"),
    ],
)
def test_bad_tier_options_are_one_line_and_exit_2(cli: Any, argv: list[str], word: str) -> None:
    code, out, err = cli("plan", "qwen3-8b", "--kv-memory", "8GiB", *argv)
    assert code == 2 and word in err and len(err.strip().splitlines()) <= 2
