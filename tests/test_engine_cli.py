"""`kvpool generate`: JSON shape, parity with transformers through the CLI,
local folders, and one-line errors with exit code 2."""

# mypy: disable-error-code="no-untyped-call,no-any-return"
# (transformers and tokenizers are untyped: these call them and return what they give)
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine_helpers import assert_same_tokens, tiny
from kvpool.torch_engine.weights import save_folder

PROMPTS = ([5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
ARGS = (
    "--prompt-ids",
    "5,6,7",
    "--prompt-ids",
    "9,10,11,12,13,14,15,16,17,18,19",
    "--max-new-tokens",
    "6",
    "--tokens-per-block",
    "4",
)


def hf_greedy(arch: str, prompt: list[int], max_new: int) -> list[int]:
    _, hf, config = tiny(arch)
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        pad_token_id=0,
        eos_token_id=config["eos_token_id"],
    )
    return out[0, len(prompt) :].tolist()


def test_tiny_json_shape_and_parity(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("generate", "--tiny", "gemma3", *ARGS, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"requests", "kv"}
    assert [set(r) for r in data["requests"]] == [{"prompt_ids", "output_ids", "text"}] * 2
    for req, prompt in zip(data["requests"], PROMPTS, strict=True):
        assert req["prompt_ids"] == list(prompt)
        assert_same_tokens(req["output_ids"], hf_greedy("gemma3", list(prompt), 6), "cli gemma3")
    kv = data["kv"]
    assert set(kv["pages_used"]) == {"sliding", "full"}
    assert kv["preemptions"] == 0 and kv["reuse_hit_tokens"] == 0


def test_folder_equals_tiny_and_speculation_changes_nothing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, hf, config = tiny("qwen3")
    folder = save_folder(hf, config, tmp_path / "qwen3")
    code, out, err = cli("generate", str(folder), *ARGS, "--json")
    assert code == 0, err
    from_folder = json.loads(out)["requests"]
    code, out, err = cli("generate", "--tiny", "qwen3", *ARGS, "--speculate", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["requests"] == from_folder
    for req, prompt in zip(from_folder, PROMPTS, strict=True):
        assert_same_tokens(req["output_ids"], hf_greedy("qwen3", list(prompt), 6), "cli qwen3 folder")


def test_small_kv_memory_preempts_and_text_prompt(cli) -> None:  # type: ignore[no-untyped-def]
    # Llama page = 4 tokens x 2 layers x (K+V) x 2 heads x 16 dims x 4 bytes = 2 KiB;
    # 24 KiB = 12 pages. Four prompts of 16 bytes + 16 new tokens need 8 pages each.
    prompts = [f"prompt number {i}!" for i in range(4)]
    assert all(len(p.encode()) == 16 for p in prompts)
    args = [a for p in prompts for a in ("--prompt", p)]
    code, out, err = cli(
        "generate",
        "--tiny",
        "llama",
        *args,
        "--max-new-tokens",
        "16",
        "--tokens-per-block",
        "4",
        "--kv-memory",
        "24KiB",
        "--max-num-tokens",
        "16",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["kv"]["total_pages"] == {"full": 12}
    assert data["kv"]["preemptions"] > 0
    for req, p in zip(data["requests"], prompts, strict=True):
        assert req["prompt_ids"] == list(p.encode())
        assert_same_tokens(req["output_ids"], hf_greedy("llama", list(p.encode()), 16), "cli preempted")


def test_text_output(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli("generate", "--tiny", "mistral", "--prompt-ids", "1,2,3", "--max-new-tokens", "3")
    assert code == 0
    assert "request 0: 3 prompt tokens ->" in out and "sliding" in out


def test_user_errors_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cases = [
        (("generate", "--tiny", "llama"), "at least one --prompt"),
        (("generate", str(tmp_path), "--tiny", "llama", "--prompt-ids", "1"), "exactly one"),
        (("generate", str(tmp_path), "--prompt-ids", "1"), "no config.json"),
        (("generate", "--tiny", "llama", "--prompt-ids", "1,x"), "comma-separated integers"),
        (("generate", "--tiny", "llama", "--prompt-ids", "1,999"), "outside the vocabulary"),
        (("generate", "--tiny", "llama", "--prompt-ids", "1", "--kv-memory", "lots"), "cannot read size"),
        (("generate", "--tiny", "llama", "--prompt-ids", "1", "--speculate", "-1"), "--speculate"),
        (("generate", "--tiny", "llama", "--prompt-ids", "1", "--device", "nope"), "not a torch device"),
    ]
    for args, message in cases:
        code, out, err = cli(*args)
        assert code == 2, (args, code, err)
        assert message in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
        assert out == ""


def test_text_prompt_on_a_folder_without_tokenizer_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, hf, config = tiny("qwen3")
    folder = save_folder(hf, config, tmp_path / "qwen3")
    code, out, err = cli("generate", str(folder), "--prompt", "hello world")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "no tokenizer" in err and "--prompt-ids" in err


def test_prompts_keep_command_line_order_and_folder_tokenizer(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    _, hf, config = tiny("llama")
    folder = save_folder(hf, config, tmp_path / "llama")
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 40, "pages": 41}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(folder)
    code, out, err = cli(
        "generate",
        str(folder),
        "--prompt",
        "hello pages",
        "--prompt-ids",
        "7,8",
        "--prompt",
        "pages",
        "--max-new-tokens",
        "2",
        "--json",
    )
    assert code == 0, err
    assert [r["prompt_ids"] for r in json.loads(out)["requests"]] == [[40, 41], [7, 8], [41]]
    code, out, err = cli("generate", str(folder), "--prompt", "hello", "--max-new-tokens", "2")
    assert code == 0, err
    assert "request 0: 1 prompt tokens" in out and "'" in out  # decoded text printed


def test_hybrid_kv_memory_splits_by_the_requests(cli) -> None:  # type: ignore[no-untyped-def]
    # Gemma 3 pages at 4 tokens: sliding = 4 x 5 layers x (K+V) x 2 heads x 16
    # dims x 4 bytes = 5120 B, full (1 layer) = 1024 B. Split by the requests'
    # own lengths, 64 KiB holds both groups (the 2049-token reference request
    # would give the sliding group almost nothing); three requests still
    # contend, so some are preempted and recomputed.
    prompts = ["the cat sat on the mat; the cat", "the cat sat on the mat; a dog", "hello kvpool"]
    args = [a for p in prompts for a in ("--prompt", p)]
    code, out, err = cli(
        "generate",
        "--tiny",
        "gemma3",
        *args,
        "--max-new-tokens",
        "16",
        "--tokens-per-block",
        "4",
        "--speculate",
        "3",
        "--kv-memory",
        "64KiB",
        "--max-num-tokens",
        "16",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    pages = data["kv"]["total_pages"]
    assert pages["sliding"] > 0 and pages["full"] > 0
    assert pages["sliding"] * 5120 + pages["full"] * 1024 <= 64 * 1024
    assert data["kv"]["preemptions"] > 0
    for req, p in zip(data["requests"], prompts, strict=True):
        assert_same_tokens(req["output_ids"], hf_greedy("gemma3", list(p.encode()), 16), "cli hybrid")


def test_generate_without_the_engine_extra_says_what_to_install(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    code, out, err = cli("generate", "--tiny", "llama", "--prompt-ids", "1,2")
    assert code == 2 and out == "" and "kvpool[engine]" in err and len(err.splitlines()) == 1, err
