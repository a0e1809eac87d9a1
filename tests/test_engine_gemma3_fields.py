"""Gemma 3 config fields that used to diverge silently from transformers:
`attn_logit_softcapping` (transformers' Gemma 3 reads it but never applies it,
so neither does kvpool: logits still match) and `use_bidirectional_attention`
(refused: exit 2 naming the field)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_helpers import assert_close_logits, prompts
from kvpool.torch_engine.arch import ArchConfig, EngineError
from kvpool.torch_engine.weights import save_folder, tiny_config, tiny_model

pytest.importorskip("transformers")


def test_attn_logit_softcapping_is_ignored_as_transformers_does() -> None:
    ours, hf, _ = tiny_model("gemma3", attn_logit_softcapping=1.0)
    assert ours.cfg.attn_logit_softcap is None
    ids = prompts()[3]
    with torch.no_grad():
        assert_close_logits(ours.dense_logits(ids), hf(torch.tensor([ids])).logits[0], "gemma3 softcap field")


def test_bidirectional_attention_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(EngineError, match="use_bidirectional_attention"):
        ArchConfig.from_hf(tiny_config("gemma3", use_bidirectional_attention=True))
    _, hf, config = tiny_model("gemma3")
    folder = save_folder(hf, config | {"use_bidirectional_attention": True}, tmp_path / "g3")
    code, out, err = cli("generate", str(folder), "--prompt-ids", "1,2,3")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "use_bidirectional_attention" in err
