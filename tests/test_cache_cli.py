"""`kvpool warmup`: JSON shape, hand-computed captured/skipped shapes, errors."""

from __future__ import annotations

import json

# Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes
# = 131,072 bytes per position; 32-token pages = 4 MiB, so 64 MiB = 16 pages.
ARGS = [
    "warmup",
    "llama-3.1-8b-instruct",
    "--kv-memory",
    "64MiB",
    "--max-seq-len",
    "4096",
    "--max-batch-size",
    "32",
    "--max-num-tokens",
    "none",
    "--cuda-graph-batch-sizes",
    "1,2,4,8,16,32",
]


def test_warmup_json_lists_captured_and_skipped_shapes(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(*ARGS, "--draft-len", "3", "--draft-lens", "0,3", "--json")
    assert code == 0, err
    report = json.loads(out)
    # batch b: b - 1 one-page minimal rows; b = 32 needs 32 pages of 16 -> 16 short
    assert report["captured"] == [[b, d] for d in (0, 3) for b in (1, 2, 4, 8, 16)]
    assert report["skipped"] == [{"batch_size": 32, "draft_len": d, "group": "full", "short_pages": 16} for d in (0, 3)]
    # the long row gets the other 17 - b pages: b=1 16 x 32 = 512 tokens, b=16 one page;
    # with 3 draft tokens its token_num is 3 less
    lengths = {(b, d): t for b, d, t in report["lengths"]}
    assert [lengths[(b, 0)] for b in (1, 2, 4, 8, 16)] == [512, 480, 416, 288, 32]
    assert [lengths[(b, 3)] for b in (1, 2, 4, 8, 16)] == [509, 477, 413, 285, 29]
    assert report["reserved_pages"] == {"full": 2}  # one padding dummy per draft length


def test_warmup_text_and_default_draft_lengths(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = cli(*ARGS, "--draft-len", "2")
    assert code == 0
    assert "10 of 12 shapes captured, 2 would run eager" in out  # drafts 0 and 2
    assert "skipped: full short 16 pages" in out


def test_warmup_bad_draft_lengths_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(*ARGS, "--draft-lens", "0,x")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "draft lengths" in err


def test_draft_lengths_beyond_the_plans_are_refused(cli) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(*ARGS, "--draft-lens", "0,64")
    assert code == 2 and out == "" and "exceeds --draft-len 0" in err and err.count("\n") == 1
