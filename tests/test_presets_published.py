"""Each bundled preset that has a published config.json in tests/data/configs/
gives the same KV layout as that file: same groups, layers, bytes, windows and
context length. (The presets were written from secondary sources; these files
are copies of the published configs, see tests/data/configs/SOURCES.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpool.spec import ModelSpec, load_model_spec

CONFIGS = Path(__file__).parent / "data" / "configs"
# preset -> published config of the same architecture (Instruct / base / -it twins
# share every cache-shaping field)
PUBLISHED = {
    "llama-3.1-8b-instruct": "Meta-Llama-3.1-8B",
    "llama-3.1-70b": "Meta-Llama-3.1-70B",
    "qwen3-0.6b": "Qwen3-0.6B",
    "qwen3-8b": "Qwen3-8B",
    "qwen3-32b": "Qwen3-32B",
    "gpt-oss-20b": "gpt-oss-20b",
    "gpt-oss-120b": "gpt-oss-120b",
    "deepseek-v3": "DeepSeek-V3",
    "deepseek-v3.2-exp": "DeepSeek-V3.2",
    "deepseek-v4-flash": "DeepSeek-V4-Flash",
    "gemma-2-9b": "gemma-2-9b-it",
    "gemma-3-27b": "gemma-3-27b-it",
    "gemma-4-26b-a4b": "gemma-4-26B-A4B",
    "llama-4-scout-17b-16e": "Llama-4-Scout-17B-16E-Instruct",
    "qwen3-next-80b-a3b": "Qwen3-Next-80B-A3B-Thinking",
}


def layout(spec: ModelSpec) -> tuple[Any, ...]:
    groups = [(g.name, g.kind, g.layers, g.row_bytes, g.state_bytes, g.window, g.ratio) for g in spec.groups]
    return spec.num_layers, spec.max_position_embeddings, spec.kv_dtype, spec.tokens_per_block, groups


@pytest.mark.parametrize(("preset", "published"), sorted(PUBLISHED.items()))
@pytest.mark.parametrize("tp", [1, 8])
def test_preset_matches_the_published_config(preset: str, published: str, tp: int) -> None:
    want = layout(load_model_spec(CONFIGS / f"{published}.json", tp_size=tp))
    assert layout(load_model_spec(preset, tp_size=tp)) == want
