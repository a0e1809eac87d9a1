"""Calibration: the engine models against start-up lines printed in public
issues (tests/data/engine_logs/cases.json, each case with its source URL).

Printed memory is rounded to 0.01 GiB, so a case passes when the printed number
lies between the predictions at memory - 0.005 GiB and memory + 0.005 GiB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpool import ServingLimits, load_model_spec
from kvpool.engines import sglang, trtllm, vllm
from kvpool.engines.common import EngineReport
from kvpool.spec import ModelSpec

GIB = 2**30
DATA = json.loads((Path(__file__).parent / "data/engine_logs/cases.json").read_text())
CASES = DATA["cases"]


def case_spec(case: dict[str, Any]) -> ModelSpec:
    model = case["model"]
    source = DATA["configs"].get(model, model)
    return load_model_spec(
        source,
        kv_dtype=case.get("kv_dtype", "auto"),
        tp_size=case.get("tp", 1),
        max_seq_len=case["max_seq_len"],
        tokens_per_block=case.get("tokens_per_block"),
    )


def report_at(case: dict[str, Any], memory_gib: float) -> EngineReport:
    spec = case_spec(case)
    limits = ServingLimits(max_seq_len=case["max_seq_len"], max_batch_size=case.get("max_batch_size", 256))
    memory = int(memory_gib * GIB * case.get("memory_fraction", 1.0))
    if case["engine"] == "vllm":
        return vllm.allocate(spec, limits, memory)
    if case["engine"] == "sglang":
        # K + V sizes count the pool plus one padding page; the pool is what is left
        return sglang.allocate(spec, limits, memory)
    return trtllm.allocate(spec, limits, memory)


def predicted(case: dict[str, Any], report: EngineReport) -> dict[str, Any]:
    out: dict[str, Any] = dict(report.reported)
    out["refused"] = bool(report.refusals)
    if case["engine"] == "trtllm":
        out["blocks"] = report.pools[0].pages
    if report.refusals and "estimated maximum model length is" in report.refusals[0]:
        text = report.refusals[0]
        out["estimated_max_model_len"] = int(text.rsplit("is ", 1)[1].rstrip("."))
        out["needed_gib"] = float(text.split("(")[2].split(" ")[0])
    if case["engine"] == "vllm" and case["max_seq_len"] > out.get("gpu_kv_cache_tokens", 0) > 0:
        out["refused"] = True  # v0 refused a max_model_len longer than the cache
    return out


def interval(case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    m, d = case["memory_gib"], case.get("memory_tolerance_gib", 0.005)
    lo, hi = (predicted(case, report_at(case, m + e)) for e in (-d, d))
    return lo, hi


def within(value: Any, lo: Any, hi: Any, key: str) -> bool:
    if isinstance(value, bool):
        return bool(lo == value == hi)
    if key in ("max_concurrency", "needed_gib"):  # printed with 2 decimals
        return bool(round(lo - 0.005, 2) <= value <= round(hi + 0.005, 2))
    return bool(min(lo, hi) <= value <= max(lo, hi))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_prediction_from_the_printed_memory(case: dict[str, Any]) -> None:
    lo, hi = interval(case)
    misses = {}
    for key, value in case["expect"].items():
        if key == "num_gpu_blocks" and "num_gpu_blocks" in lo:
            ok = within(value, lo[key], hi[key], key)
        else:
            ok = within(value, lo.get(key), hi.get(key), key) if key in lo else False
        if not ok:
            misses[key] = (value, lo.get(key), hi.get(key))
    if case.get("reproduced", True):
        assert not misses, misses
    else:
        assert misses and case["gap"], "a case marked as a gap is reproduced now: update the table"


def test_at_least_eight_cases_with_sources() -> None:
    assert len(CASES) >= 8
    assert all(c["source"].startswith("https://github.com/") for c in CASES)
    assert {c["engine"] for c in CASES} == {"vllm", "sglang", "trtllm"}
