"""vLLM's own dummy sampler as referee for the sampler half of kvpool's activation
estimate (plan/memory.py `sampler_peak`, `SAMPLER_BYTES`): vLLM 0.32's
`GPUModelRunner._dummy_sampler_run`, the call `profile_run` makes after its forward pass,
run on CPU in its side venv with every allocation counted
(tests/engines_truth/sampler_runner.py), on the vocabularies and hidden sizes of published
configs (tests/data/configs). It holds 14 bytes per row and vocabulary entry (bf16 logits,
their float32 copy, the probabilities, the exponential noise) and one random bf16 stand-in
for the hidden rows; what is left is the sampling metadata's per-row vectors.

The side venv runs it; without it this test skips, unless KVPOOL_ENGINES_REQUIRED=1
(set by `make test`), when it fails."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from engines_truth.cases import CONFIGS
from engines_truth.lane import HERE, engine_python, run_engine
from kvpool.plan.memory import ACTIVATION_BYTES, SAMPLER_BYTES

MODELS = ("Qwen3-32B", "Meta-Llama-3.1-70B", "Mixtral-8x7B-v0.1", "gpt-oss-120b")
ROWS = (8, 20)
PER_ROW_METADATA = 64  # bytes: a handful of float32 / int64 vectors of one entry per row


def _config(name: str) -> dict[str, int]:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    config = config.get("text_config", config)
    return {"vocab": int(config["vocab_size"]), "hidden": int(config["hidden_size"])}


def test_kvpool_counts_what_vllms_dummy_sampler_holds() -> None:
    if engine_python("vllm@0.32") is None:
        if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
            pytest.fail("the vllm@0.32 side venv is missing: run `make engines-venvs`")
        pytest.skip("no vllm@0.32 side venv (make engines-venvs)")
    cases: list[dict[str, Any]] = [{"id": f"{m}-{r}", "rows": r, **_config(m)} for m in MODELS for r in ROWS]
    theirs = run_engine("vllm@0.32", cases, HERE / "sampler_runner.py")
    for case in cases:
        got = theirs[case["id"]]
        assert "error" not in got, got
        rows, vocab, hidden = int(case["rows"]), int(case["vocab"]), int(case["hidden"])
        counted = SAMPLER_BYTES * rows * vocab + ACTIVATION_BYTES * rows * hidden
        assert 0 <= got["peak"] - counted <= PER_ROW_METADATA * rows, (case, got["peak"] - counted)
