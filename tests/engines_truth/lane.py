"""The differential lane: run an engine's own sizing code in its side venv on
every case (tests/engines_truth/cases.py) and set kvpool's numbers beside it.

The side venvs live under $KVPOOL_ENGINES_CACHE (default
~/.cache/kvpool-engines), built by `make engines-venvs`.
`PYTHONPATH=tests python -m engines_truth.lane` prints the table (`make engines-truth`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from engines_truth.cases import SGLANG_CASES, VLLM_CASES, VLLM_SPEC_CASES
from kvpool import ServingLimits, load_model_spec
from kvpool.engines import EngineNotModelledError, sglang, vllm
from kvpool.spec import ModelSpec
from kvpool.spec.drafts import load_draft, mtp_draft

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("KVPOOL_ENGINES_CACHE", Path.home() / ".cache" / "kvpool-engines"))
# The version matrix: each engine release's side venv and runner (`make engines-venvs`).
VENVS = {
    "vllm@0.33": CACHE / "vllm-0.33",
    "vllm@0.32": CACHE / "vllm-0.32",
    "sglang": CACHE / "sglang-0.5.23",
}
RUNNERS = {
    "vllm@0.33": HERE / "vllm_runner.py",
    "vllm@0.32": HERE / "vllm_runner.py",
    "sglang": HERE / "sglang_runner.py",
}
VLLM_RELEASES = ("vllm@0.33", "vllm@0.32")
VLLM_FIELDS = (
    "refused",
    "estimated_max_len",
    "num_gpu_blocks",
    "kv_cache_groups",
    "block_size",
    "gpu_kv_cache_tokens",
    "max_concurrency",
    "eagle_groups",
    "line",
)


def engine_python(engine: str) -> Path | None:
    """The side venv's interpreter, or None when it has not been built."""
    python = VENVS[engine] / "bin" / "python"
    return python if python.exists() else None


def run_engine(engine: str, cases: list[dict[str, Any]], runner: Path | None = None) -> dict[str, dict[str, Any]]:
    """The engine's own results by case id (one interpreter for all cases), from its
    sizing runner or another `runner` (parsers_runner.py: its command-line parsers)."""
    python = engine_python(engine)
    if python is None:
        raise FileNotFoundError(f"no side venv for {engine} under {CACHE}: run `make engines-venvs`")
    done = subprocess.run(
        [str(python), str(runner or RUNNERS[engine])],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        # VLLM_TARGET_DEVICE: the vllm==0.33.0 wheel is CUDA's; its sizing code runs on vLLM's CPU platform
        env={
            **os.environ,
            "VLLM_LOGGING_LEVEL": "ERROR",
            "TOKENIZERS_PARALLELISM": "false",
            "VLLM_TARGET_DEVICE": "cpu",
        },
    )
    return {r["id"]: r for r in json.loads(done.stdout)}


def vllm_fields(engine: dict[str, Any]) -> dict[str, Any]:
    """The fields vLLM printed (or refused with) for one case."""
    if engine.get("refused"):
        return {"refused": engine["refused"], "estimated_max_len": engine["estimated_max_len"]}
    return {"refused": None} | {k: engine[k] for k in VLLM_FIELDS[2:]}


def vllm_spec(case: dict[str, Any]) -> ModelSpec:
    """kvpool's spec of a case's model, with its drafter (spec/drafts.py) if any."""
    spec = load_model_spec(
        case["config"],
        kv_dtype=case["kv_dtype"],
        tp_size=case["tp"],
        pp_size=case["pp"],
        ssm_dtype=case.get("mamba_ssm_cache_dtype", "auto"),
    )
    draft = case.get("draft")
    if not draft:
        return spec
    if draft["method"] == "mtp":
        return mtp_draft(spec, draft["layers"])
    return load_draft(spec, draft["config"], method=draft["method"])


def kvpool_vllm(case: dict[str, Any], engine: str = VLLM_RELEASES[0]) -> dict[str, Any]:
    """The same fields from kvpool's vLLM model of release `engine` (vllm@X)."""
    spec = vllm_spec(case)
    draft = case.get("draft") or {}
    limits = ServingLimits(
        max_seq_len=case["max_model_len"],
        max_num_tokens=case["max_num_batched_tokens"],
        max_batch_size=case["max_num_seqs"],
        max_draft_len=draft.get("num_speculative_tokens", 0),
    )
    try:
        r = vllm.allocate(
            spec,
            limits,
            case["memory"],
            block_size=case["block_size"],
            async_scheduling=case["async_scheduling"],
            release=engine.partition("@")[2],
        )
    except EngineNotModelledError as e:
        return {"refused": f"not modelled: {e}"}
    sizing = [x for x in r.refusals if x.startswith(("To serve", "No available memory"))]
    if sizing:
        return {
            "refused": sizing[0].split(". ")[0],
            "estimated_max_len": r.reported.get("estimated_max_model_len") or 0,
        }
    rep = r.reported
    return {
        "refused": None,
        "num_gpu_blocks": rep["num_gpu_blocks"],
        "kv_cache_groups": rep["kv_cache_groups"],
        "block_size": rep["block_size"],
        "gpu_kv_cache_tokens": rep["gpu_kv_cache_tokens"],
        "max_concurrency": rep["max_concurrency"],
        "eagle_groups": rep["eagle_groups"],
        "line": r.lines[0],
    }


def sglang_fields(engine: dict[str, Any]) -> dict[str, Any]:
    """The fields SGLang logged (or refused with) for one case."""
    if engine.get("refused"):
        return {"refused": engine["refused"]}
    return {k: engine[k] for k in ("refused", "max_total_num_tokens", "swa_tokens", "max_running_requests")}


def kvpool_sglang(case: dict[str, Any]) -> dict[str, Any]:
    """The same fields from kvpool's SGLang model."""
    spec = load_model_spec(case["config"], kv_dtype=case["kv_dtype"], tp_size=case["tp"])
    limits = ServingLimits(max_seq_len=case["context_length"], max_num_tokens=case["chunked_prefill_size"])
    options: dict[str, Any] = {"page_size": case["page_size"], "max_running_requests": case["max_running_requests"]}
    if case["swa_full_tokens_ratio"] is not None:
        options["swa_full_tokens_ratio"] = case["swa_full_tokens_ratio"]
    try:
        r = sglang.allocate(spec, limits, case["memory"], **options)
    except EngineNotModelledError as e:
        return {"refused": f"not modelled: {e}"}
    if r.refusals:
        return {"refused": r.refusals[0].split(". ")[0]}
    return {
        "refused": None,
        "max_total_num_tokens": r.reported["full_tokens"],
        "swa_tokens": r.reported["swa_tokens"],
        "max_running_requests": r.reported["max_running_requests"],
    }


CASES = {
    "vllm@0.33": VLLM_CASES + VLLM_SPEC_CASES,
    "vllm@0.32": VLLM_CASES + VLLM_SPEC_CASES,
    "sglang": SGLANG_CASES,
}


def fields_of(engine: str) -> tuple[Any, Any]:
    """(engine's fields, kvpool's fields) of one runner's results."""
    if engine == "sglang":
        return sglang_fields, kvpool_sglang
    return vllm_fields, lambda case: kvpool_vllm(case, engine)


def rows(engine: str = VLLM_RELEASES[0]) -> list[tuple[str, str, Any, Any]]:
    """(case, field, engine's value, kvpool's value) for every compared field."""
    results = run_engine(engine, CASES[engine])
    theirs_of, ours_of = fields_of(engine)
    out = []
    for case in CASES[engine]:
        theirs = results[case["id"]]
        ours = ours_of(case)
        if "error" in theirs:
            out.append((case["id"], "error", theirs["error"], ours.get("refused")))
            continue
        mine = theirs_of(theirs)
        for key in mine:
            out.append((case["id"], key, mine[key], ours.get(key)))
    return out


def table(engine: str = VLLM_RELEASES[0]) -> str:
    lines = [f"| case ({engine}) | field | engine | kvpool | equal |", "|---|---|---|---|---|"]
    for cid, key, theirs, ours in rows(engine):
        lines.append(f"| {cid} | {key} | {theirs} | {ours} | {'yes' if theirs == ours else '**no**'} |")
    return "\n".join(lines)


def _text(values: dict[str, Any]) -> str:
    """A row's cell: every field but the printed line (its numbers are the fields),
    a refusal by its numbers only (the whole text is compared in the tests)."""
    cells = []
    for k, v in values.items():
        if k == "line" or v is None:
            continue
        if k == "refused":
            v = "yes: " + ", ".join(re.findall(r"\(([^()]*\d[^()]*)\)", v))
        cells.append(f"{k} {v}")
    return "; ".join(cells)


def case_table(engine: str) -> str:
    """One row per case: every compared field the engine gave, kvpool's, equal."""
    results = run_engine(engine, CASES[engine])
    theirs_of, ours_of = fields_of(engine)
    lines = ["| case | engine's own | kvpool | equal |", "|---|---|---|---|"]
    for case in CASES[engine]:
        raw = results[case["id"]]
        theirs = {"error": raw["error"]} if "error" in raw else theirs_of(raw)
        ours = ours_of(case)
        same = "yes" if theirs == ours else "**no**"
        lines.append(f"| {case['id']} | {_text(theirs)} | {_text(ours)} | {same} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cases"]:
        for name in sys.argv[2:] or list(VENVS):
            sys.stdout.write(case_table(name) + "\n\n")
        sys.exit(0)
    for name in sys.argv[1:] or list(VENVS):
        sys.stdout.write(table(name) + "\n\n")
