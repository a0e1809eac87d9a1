"""The typed plan request: one read of the model's config per command, one spec,
and the same plan as the library's own functions give."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import attention_config
from kvpool import load_model_spec, plan_pools, presets
from kvpool.cli.main import build_parser
from kvpool.cli.plan_args import plan_keywords
from kvpool.deploy import resolution as deploy_resolve
from kvpool.deploy.options import BudgetOptions, LimitOptions, ModelOptions, PlanRequest
from kvpool.plan import ServingLimits


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the bundled configs read and the specs built while a test runs."""
    counts = {"config": 0, "spec": 0}
    load_config, build = presets.load_model_config, deploy_resolve.spec_from_read  # type: ignore[attr-defined]

    def counted_config(name: str) -> dict[str, Any]:
        counts["config"] += 1
        return load_config(name)

    def counted_spec(*a: Any, **k: Any) -> Any:
        counts["spec"] += 1
        return build(*a, **k)

    monkeypatch.setattr(presets, "load_model_config", counted_config)
    monkeypatch.setattr(deploy_resolve, "spec_from_read", counted_spec)
    return counts


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "qwen3-32b", "--gpu", "h100", "--engine", "vllm"],  # was 5 reads, 2 specs
        ["plan", "qwen3-32b", "--kv-memory", "20GiB", "--engine", "sglang", "--json"],  # was 4
        ["plan", "gemma-3-27b", "--gpu", "h100", "--tp", "2", "--emit", "vllm"],
        ["warmup", "qwen3-8b", "--kv-memory", "4GiB"],
        ["inspect", "qwen3-8b"],
    ],
)
def test_a_command_reads_the_config_once(cli: Any, reads: dict[str, int], argv: list[str]) -> None:
    code, _, err = cli(*argv)
    assert code == 0, err
    assert reads["config"] == 1
    assert reads["spec"] == 1  # inspect too builds its one spec through deploy.resolution


def test_the_request_is_frozen_and_holds_no_namespace() -> None:
    args = argparse.Namespace(
        **vars(build_parser().parse_args(["plan", "qwen3-8b", "--kv-memory", "4GiB", "--weights-memory", "1GiB"]))
    )
    request = PlanRequest.of(args.model, args.gpu, **plan_keywords(args))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.shrink_to_fit = True  # type: ignore[misc]
    parts: list[Any] = [request, request.model, request.budget, request.limits]
    assert all(dataclasses.is_dataclass(p) for p in parts)
    assert not any(isinstance(getattr(p, f.name), argparse.Namespace) for p in parts for f in dataclasses.fields(p))
    assert request.budget.parts == (("weights_memory", "1GiB"),)


def test_resolved_plan_is_the_library_plan() -> None:
    """resolve + plan gives what load_model_spec + plan_pools give by hand."""
    request = PlanRequest(
        ModelOptions("gemma-3-27b", tp=2), BudgetOptions(kv_memory="6GiB"), LimitOptions(64, 16384, 4096)
    )
    resolved = deploy_resolve.resolve(request)
    spec = load_model_spec("gemma-3-27b", tp_size=2, max_seq_len=16384)
    limits = ServingLimits(max_batch_size=64, max_seq_len=16384, max_num_tokens=4096)
    expected = plan_pools(spec, limits, kv_memory_bytes=6 << 30)
    assert resolved.limits == limits
    assert resolved.plan().to_json() == expected.to_json()


def test_max_seq_len_defaults_to_the_models_positions_capped(tmp_path: Path) -> None:
    """No --max-seq-len: the config's max_position_embeddings, at most 8192."""
    small = tmp_path / "config.json"
    small.write_text(json.dumps(attention_config(max_position_embeddings=3000)))
    for model, expected in (("qwen3-8b", 8192), (str(small), 3000)):
        request = PlanRequest(ModelOptions(model), BudgetOptions(kv_memory="4GiB"), LimitOptions(8, None, 2048))
        assert deploy_resolve.resolve(request).limits.max_seq_len == expected


def test_dp_that_does_not_divide_tp_is_named() -> None:
    with pytest.raises(Exception, match="--dp 2 must divide --tp 3"):
        _ = ModelOptions("qwen3-8b", tp=3, dp=2).attention_tp


def test_one_page_size_default_everywhere() -> None:
    """Every command leaves the page size to the spec's one default (generate used 16, plan 32)."""
    parser = build_parser()
    commands = {
        "plan": ["plan", "qwen3-8b"],
        "fit": ["fit", "qwen3-8b"],
        "warmup": ["warmup", "qwen3-8b"],
        "inspect": ["inspect", "qwen3-8b"],
        "simulate": ["simulate", "qwen3-8b", "--trace", "azure-conv"],
        "generate": ["generate", "--tiny", "llama"],
    }
    for argv in commands.values():
        assert parser.parse_args(argv).tokens_per_block is None, argv[0]
    assert load_model_spec("qwen3-8b").tokens_per_block == 32
