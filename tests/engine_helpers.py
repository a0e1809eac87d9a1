"""Factories and assertion helpers shared by the engine tests (torch needed)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.torch_engine.model import DecoderLM
from kvpool.torch_engine.weights import tiny_model

# Float32 on CPU; batching and paging reorder the sums, so logits match to
# ~1e-6 of magnitudes ~3. The stated tolerance leaves two orders of margin.
LOGIT_ATOL = 1e-4


@functools.cache
def tiny(arch: str, seed: int = 0) -> tuple[DecoderLM, Any, dict[str, Any]]:
    """(our model, transformers model, config) with identical weights; cached
    per test session because building transformers models is the slow part."""
    torch.set_num_threads(1)
    return tiny_model(arch, seed)


def tiny_spec(config: dict[str, Any], tokens_per_block: int = 4) -> ModelSpec:
    return load_model_spec(config, kv_dtype="fp32", tokens_per_block=tokens_per_block)


def manual_plan(spec: ModelSpec, pages: int, **limits: Any) -> PoolPlan:
    """A plan with `pages` slots in every group."""
    return PoolPlan.from_pages(spec, {g.name: pages for g in spec.groups}, ServingLimits(**limits))


def assert_close_logits(got: torch.Tensor, want: torch.Tensor, what: str, atol: float = LOGIT_ATOL) -> None:
    diff = (got - want).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if worst > atol:
        at = np.unravel_index(int(diff.argmax()), tuple(diff.shape))
        raise AssertionError(
            f"{what}: logits differ by {worst:.3g} > {atol} at {at}: "
            f"got {float(got[at]):.6f}, want {float(want[at]):.6f}"
        )


def assert_same_tokens(got: list[int], want: list[int], what: str) -> None:
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        raise AssertionError(f"{what}: tokens differ from index {first}:\n  got  {got}\n  want {want}")


MAX_NEW = 20
SHARED = 23  # shared prefix length: 5 whole 4-token pages + 3 tokens


def prompts() -> list[list[int]]:
    """Eight prompts: four of their own, four sharing a 23-token prefix."""
    rng = np.random.default_rng(7)
    shared = rng.integers(3, 256, SHARED).tolist()
    own = [rng.integers(3, 256, n).tolist() for n in (3, 9, 17, 30)]
    return own + [shared + rng.integers(3, 256, n).tolist() for n in (1, 5, 12, 2)]


def hf_greedy(hf: Any, prompt: list[int], max_new: int, eos: int | list[int]) -> list[int]:
    """transformers' own greedy continuation of one prompt: the parity reference."""
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        pad_token_id=0,
        eos_token_id=eos,
    )
    tokens: list[int] = out[0, len(prompt) :].tolist()
    return tokens
