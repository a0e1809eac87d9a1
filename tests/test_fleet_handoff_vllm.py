"""The bytes a prefill worker hands a decode worker, per pool group
(`kvpool.fleet.handoff`), against vLLM's own decode-side allocation: for each
model and prompt length, vLLM's `KVCacheManager.allocate_slots` adopts the
whole prompt as external computed tokens (the NixlConnector's remote-prefill
path) in vLLM's side venv (tests/engines_truth/vllm_handoff_runner.py), and its
non-null blocks per KV cache group times the group's page bytes must equal
kvpool's handoff of that kind, exactly.

Models: gemma-3 (sliding 1024 + full), gpt-oss (sliding 128 + full),
Qwen3-Next (gated-delta-net states + full), Nemotron-H (Mamba-2 states + full),
Llama 4 Scout (chunked 8192 + full), DeepSeek-V3 (MLA); prompts of 1K, 8K, 32K
and 128K tokens. kvpool's specs come from the bundled presets (equal to the
published config.json files vLLM reads, checked here) or the published file.

Skipped without the side venv, required with KVPOOL_ENGINES_REQUIRED=1.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from engines_truth.cases import CONFIGS
from engines_truth.lane import CACHE
from kvpool.engines.vllm import Vllm
from kvpool.fleet import handoff
from kvpool.plan import ServingLimits
from kvpool.spec import ModelSpec, load_model_spec

RUNNER = Path(__file__).parent / "engines_truth" / "vllm_handoff_runner.py"
LENGTHS = (1024, 8192, 32768, 131072)
# (preset or None, published config, vLLM --block-size); MLA at 64 tokens (FlashMLA's block)
MODELS = {
    "gemma-3-27b": ("gemma-3-27b", "gemma-3-27b-it", 16),
    "gpt-oss-20b": ("gpt-oss-20b", "gpt-oss-20b", 16),
    "qwen3-next-80b-a3b": ("qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B-Thinking", 16),
    "nemotron-h-56b": (None, "Nemotron-H-56B-Base-8K", 16),
    "llama-4-scout-17b-16e": ("llama-4-scout-17b-16e", "Llama-4-Scout-17B-16E-Instruct", 16),
    "deepseek-v3": ("deepseek-v3", "DeepSeek-V3", 64),
}


def side_python() -> Path:
    python = CACHE / "vllm-0.33" / "bin" / "python"
    if python.exists():
        return python
    if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
        pytest.fail("the vllm-0.33 side venv is missing: run `make engines-venvs`")
    pytest.skip("no vllm-0.33 side venv")


def kvpool_spec(model: str) -> ModelSpec:
    """kvpool's spec at the page size vLLM serves it with: `--block-size`, or for a
    hybrid with state layers the attention block size vLLM raises it to (kvpool's
    model of `Platform._align_hybrid_block_size`, docs/engines.md)."""
    preset, config, bs = MODELS[model]
    source = preset or str(CONFIGS / f"{config}.json")
    spec = load_model_spec(source, tokens_per_block=bs)
    if any(g.kind == "state" for g in spec.groups):
        sizing = Vllm(block_size=bs).size(spec, ServingLimits(max_seq_len=8192), 64 << 30)
        spec = load_model_spec(source, tokens_per_block=sizing.groups[0].block_size)
    return spec


def case(model: str, length: int) -> dict[str, Any]:
    _, config, bs = MODELS[model]
    out: dict[str, Any] = {
        "id": f"{model}@{length}",
        "config": str(CONFIGS / f"{config}.json"),
        "prompt_tokens": length,
        "block_size": bs,
    }
    if model == "qwen3-next-80b-a3b":  # vLLM cannot import its model class on CPU: the runner's docstring
        spec = kvpool_spec(model)
        sizing = Vllm(block_size=bs).size(spec, ServingLimits(max_seq_len=8192), 64 << 30)
        out["aligned"] = {"block_size": spec.tokens_per_block, "mamba_page_size_padded": sizing.page}
    return out


@functools.cache
def vllm_results() -> dict[str, dict[str, Any]]:
    cases = [case(m, n) for m in MODELS for n in LENGTHS]
    done = subprocess.run(
        [str(side_python()), str(RUNNER)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        cwd=RUNNER.parent,
        env={
            **os.environ,
            "VLLM_LOGGING_LEVEL": "ERROR",
            "VLLM_TARGET_DEVICE": "cpu",
            "TOKENIZERS_PARALLELISM": "false",
        },
    )
    return {r["id"]: r for r in json.loads(done.stdout)}


def per_kind(result: dict[str, Any]) -> tuple[dict[str, int], dict[str, set[int]]]:
    """vLLM's bytes per kind (blocks x layers x page bytes, over its groups) and the
    block counts its groups of that kind hold."""
    moved: dict[str, int] = defaultdict(int)
    blocks: dict[str, set[int]] = defaultdict(set)
    for g in result["groups"]:
        moved[g["kind"]] += g["blocks"] * g["layers"] * g["layer_page_bytes"]
        blocks[g["kind"]].add(g["blocks"])
    return dict(moved), dict(blocks)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("model", list(MODELS))
def test_handoff_bytes_are_vllms_blocks_times_page_bytes(model: str, length: int) -> None:
    result = vllm_results()[f"{model}@{length}"]
    assert "error" not in result, result
    spec = kvpool_spec(model)
    assert result["block_size"] == spec.tokens_per_block
    h = handoff(spec, length)
    ours: dict[str, int] = defaultdict(int)
    for g in h.groups:
        ours[g.kind] += g.bytes
    theirs, blocks = per_kind(result)
    assert dict(ours) == theirs
    for g in h.groups:  # one kvpool group per kind here: every vLLM group of that kind holds its slots
        assert blocks[g.kind] == {g.slots}, (g, blocks)


@pytest.mark.parametrize("model", [m for m, (preset, _, _) in MODELS.items() if preset])
def test_the_presets_are_the_published_configs(model: str) -> None:
    preset, config, bs = MODELS[model]
    assert preset is not None
    ours = load_model_spec(preset, tokens_per_block=bs)
    assert ours.groups == load_model_spec(str(CONFIGS / f"{config}.json"), tokens_per_block=bs).groups


def table() -> str:
    """The markdown table of docs/fleet.md (`PYTHONPATH=tests python -c 'import
    test_fleet_handoff_vllm as t; print(t.table())'`)."""
    rows = [
        "| model | prompt | group (kind) | kvpool pages | kvpool bytes | vLLM blocks x groups | vLLM bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        spec = kvpool_spec(model)
        for length in LENGTHS:
            result = vllm_results()[f"{model}@{length}"]
            theirs, _ = per_kind(result)
            for g in handoff(spec, length).groups:
                vg = [x for x in result["groups"] if x["kind"] == g.kind]
                counts = "+".join(sorted({str(x["blocks"]) for x in vg})) + f" x {len(vg)}"
                rows.append(
                    f"| {model} | {length:,} | {g.group} ({g.kind}) | {g.slots:,} | {g.bytes:,} | {counts} | {theirs[g.kind]:,} |"
                )
    return "\n".join(rows)
