"""The engines' own sizing code as referee: every field kvpool prints for vLLM
0.33 and 0.32 equals what that release's `get_kv_cache_configs` ->
`get_kv_cache_capacity` gives on the same deployment (speculative-decoding
cases included: the drafter's layers grouped, the EAGLE groups flagged), and every pool size it prints for SGLang 0.5.23 what
SGLang's `KVCacheConfigurator.config_from_budget` -> `resolve_max_num_reqs`
gives (tests/engines_truth/: cases, runners, lane).

The engine runs in its side venv (`make engines-venvs`); without it these tests
skip, unless KVPOOL_ENGINES_REQUIRED=1 (set by `make test`), when they fail.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from engines_truth.cases import SGLANG_CASES, VLLM_CASES, VLLM_SPEC_CASES
from engines_truth.lane import (
    CASES,
    VLLM_RELEASES,
    engine_python,
    kvpool_sglang,
    kvpool_vllm,
    run_engine,
    sglang_fields,
    vllm_fields,
)


def results_of(engine: str, cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if engine_python(engine) is None:
        if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
            pytest.fail(f"the {engine} side venv is missing: run `make engines-venvs`")
        pytest.skip(f"no {engine} side venv (make engines-venvs)")
    return run_engine(engine, cases)


@pytest.fixture(scope="module", params=VLLM_RELEASES)
def vllm_results(request: pytest.FixtureRequest) -> tuple[str, dict[str, dict[str, Any]]]:
    return request.param, results_of(request.param, CASES[request.param])


@pytest.fixture(scope="module")
def sglang_results() -> dict[str, dict[str, Any]]:
    return results_of("sglang", SGLANG_CASES)


def test_the_lane_covers_what_the_issue_asks() -> None:
    ids = [c["id"] for c in VLLM_CASES]
    assert len(ids) == len(set(ids)) >= 40
    assert {c["block_size"] for c in VLLM_CASES} >= {16, 32, 64}
    assert {c["tp"] for c in VLLM_CASES} >= {1, 2, 4, 8}
    assert {c["async_scheduling"] for c in VLLM_CASES} == {True, False}
    methods = [c["draft"]["method"] for c in VLLM_SPEC_CASES]
    assert len(methods) >= 6 and {"eagle3", "mtp", "draft_model"} <= set(methods)
    # EAGLE-3 on a sliding-window model, an MTP model, a separate draft model
    assert any(
        c["draft"]["method"] == "eagle3" and c["model"].startswith(("gpt-oss", "gemma")) for c in VLLM_SPEC_CASES
    )
    assert any("refuse" in i for i in ids) and any("edge-start" in i for i in ids)
    sg = [c["id"] for c in SGLANG_CASES]
    assert len(sg) == len(set(sg)) >= 20
    assert {c["page_size"] for c in SGLANG_CASES} >= {1, 16, 64} and {c["tp"] for c in SGLANG_CASES} >= {1, 2, 4, 8}


ALL_VLLM = VLLM_CASES + VLLM_SPEC_CASES


@pytest.mark.parametrize("case", ALL_VLLM, ids=[c["id"] for c in ALL_VLLM])
def test_kvpool_prints_what_vllm_computes(
    case: dict[str, Any], vllm_results: tuple[str, dict[str, dict[str, Any]]]
) -> None:
    release, results = vllm_results
    theirs = results[case["id"]]
    assert "error" not in theirs, theirs.get("error")
    assert kvpool_vllm(case, release) == vllm_fields(theirs)


def test_the_releases_differ_where_docs_say(vllm_results: tuple[str, dict[str, dict[str, Any]]]) -> None:
    """0.33 flags the groups holding a drafter's layers (is_draft) as EAGLE groups; 0.32
    flags none for an EAGLE-3 head; the sizing itself is the same (the other fields)."""
    release, results = vllm_results
    eagle = results["gpt-oss-20b-eagle3"]
    assert eagle["eagle_groups"] == (1 if release == "vllm@0.33" else 0)
    assert (eagle["num_gpu_blocks"], eagle["kv_cache_groups"]) == (50412, 2)


@pytest.mark.parametrize("case", SGLANG_CASES, ids=[c["id"] for c in SGLANG_CASES])
def test_kvpool_prints_what_sglang_computes(case: dict[str, Any], sglang_results: dict[str, dict[str, Any]]) -> None:
    theirs = sglang_results[case["id"]]
    assert "error" not in theirs, theirs.get("error")
    assert kvpool_sglang(case) == sglang_fields(theirs)
