"""Each engine's KV budget by its own defaults (engines/budgets.py) against the
engines' own code in their side venvs (tests/engines_truth/budget_runner.py):
SGLang 0.5.23's `mem_fraction_static` rule over GPU sizes and TP, vLLM's default
`gpu_memory_utilization` in both releases; and what `kvpool fit` prints of them."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from engines_truth.cases import CONFIGS
from engines_truth.lane import HERE, VLLM_RELEASES, engine_python, run_engine
from kvpool.engines import budgets, registry
from kvpool.plan.memory import MemoryBudget

MB = 1 << 20
# (GPU memory in MB as the device reports it, TP): H100 80 GB, H200, L40S-class 46 GB, 24 GB
SGLANG_CASES = [(81559, 2), (81559, 8), (143771, 4), (46068, 1), (16384, 1)]


def referee(venv: str, cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if engine_python(venv) is None:
        if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
            pytest.fail(f"the {venv} side venv is missing: run `make engines-venvs`")
        pytest.skip(f"no {venv} side venv (make engines-venvs)")
    return run_engine(venv, cases, HERE / "budget_runner.py")


def test_sglang_default_fraction_is_sglangs() -> None:
    cases = [
        {"id": f"{mb}-tp{tp}", "gpu_mb": mb, "tp": tp, "config": str(CONFIGS / "Qwen3-32B.json")}
        for mb, tp in SGLANG_CASES
    ]
    theirs = referee("sglang", cases)
    for mb, tp in SGLANG_CASES:
        got = theirs[f"{mb}-tp{tp}"]
        assert "error" not in got, got
        assert budgets.sglang_default_fraction(mb * MB, tp) == got["value"], (mb, tp)


@pytest.mark.parametrize("release", VLLM_RELEASES)
def test_vllm_default_utilization_is_vllms(release: str) -> None:
    """`CacheConfig.gpu_memory_utilization`'s default as the release's own source
    declares it (read from the side venv's vllm/config/cache.py: importing vLLM
    would take 20 s for one number)."""
    python = engine_python(release)
    if python is None:
        if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
            pytest.fail(f"the {release} side venv is missing: run `make engines-venvs`")
        pytest.skip(f"no {release} side venv (make engines-venvs)")
    (source,) = python.parent.parent.glob("lib/python3*/site-packages/vllm/config/cache.py")
    found = re.search(r"gpu_memory_utilization: float = Field\(default=([0-9.]+)", source.read_text())
    assert found is not None, "vLLM's CacheConfig no longer declares gpu_memory_utilization as read here"
    assert float(found.group(1)) == budgets.VLLM_UTILIZATION


def test_each_engine_default_kv_follows_its_rule() -> None:
    """By its own defaults each engine's KV is its rule on the same breakdown: vLLM's
    utilization replaces kvpool's, SGLang's fraction less the weights, TensorRT-LLM 0.9
    of what weights and activations leave."""
    gib = 1 << 30
    memory = MemoryBudget(80 * gib, 0.9, 30 * gib, gib, 64 * MB, gib, {})
    v = registry.entry("vllm").default_kv(memory, 2, 1, 256)
    assert v.kv_bytes == memory.kv_bytes + int(80 * gib * 0.92) - memory.usable_bytes
    s = registry.entry("sglang").default_kv(memory, 2, 1, 256)
    f = budgets.sglang_default_fraction(80 * gib, 2)
    assert s.kv_bytes == int(80 * gib * f) - 30 * gib and f"{f:.3f}" in s.rule
    t = registry.entry("trtllm").default_kv(memory, 2, 1, 256)
    assert t.kv_bytes == int((80 * gib - 30 * gib - gib) * 0.9)


def test_fit_shows_each_engines_own_default(cli: Any) -> None:
    import json

    code, out, err = cli("fit", "qwen3-32b", "--gpu", "h100x2", "--engine", "all", "--json")
    assert code == 0, err
    fit = json.loads(out)
    kv = fit["kv_bytes_per_rank"]
    for e in fit["engines"]:
        assert e["kv_bytes_per_rank"] == kv  # the pinned budget
        assert e["own_default"]["kv_bytes_per_rank"] > 0 and e["own_default"]["rule"]
    owns = {e["engine"]: e["own_default"]["kv_bytes_per_rank"] for e in fit["engines"]}
    assert len(set(owns.values())) == 3  # three rules, three answers
