"""Prefix reuse on models with a state group (recurrent state or a compressor's
state): a prompt that ends exactly on a page boundary is reused by the next
request that extends it, whether or not the move that computed the prompt
already stored its pages before a window released them (cache/prefix.py)."""

from __future__ import annotations

import pytest

from cache_helpers import hybrid_spec, manager
from kvpool.cache import KVCacheManager
from kvpool.spec import ModelSpec, load_model_spec


def state_specs() -> list[tuple[str, ModelSpec]]:
    """Every bundled preset with a state group, plus a full + sliding + state toy."""
    presets = [load_model_spec(name) for name in ("deepseek-v4-flash", "qwen3-next-80b-a3b")]
    return [("toy", hybrid_spec(tpb=16, window=40))] + [(s.name, s) for s in presets]


def serve_prompt(m: KVCacheManager, rid: int, prompt: list[int]) -> int:
    """Admit, prefill in one chunk, sample one token (history = the prompt), commit the prompt."""
    hit = m.create(rid, prompt)
    assert m.resize(rid, len(prompt), hit)
    assert m.resize(rid, len(prompt) + 1, len(prompt))
    m.commit(rid, len(prompt))
    return hit


@pytest.mark.parametrize(("name", "spec"), state_specs(), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("pages", [3, 5])
def test_a_prompt_on_a_page_boundary_is_reused_by_its_continuation(name: str, spec: ModelSpec, pages: int) -> None:
    assert any(g.rule.per_request for g in spec.groups), name
    tpb = spec.tokens_per_block
    m = manager(spec, {g.name: 64 for g in spec.groups}, max_seq_len=16 * tpb)
    prompt = list(range(1000, 1000 + pages * tpb))  # exactly `pages` whole pages
    serve_prompt(m, 0, prompt)
    m.free(0)
    # the continuation (a second turn) can reuse every page of the first: the state snapshot at
    # history len(prompt) is the one it resumes from
    assert m.create(1, prompt + list(range(5000, 5000 + tpb // 2))) == len(prompt)
    m.check_integrity()


@pytest.mark.parametrize(("name", "spec"), state_specs(), ids=lambda x: x if isinstance(x, str) else "")
def test_decoding_onto_a_page_boundary_is_reused_by_the_continuation(name: str, spec: ModelSpec) -> None:
    # the prompt stops 4 tokens short of 5 pages; 4 decode steps (`advance`, each committing its
    # token) end on the boundary, after the moves released window pages (storing them first)
    tpb = spec.tokens_per_block
    m = manager(spec, {g.name: 64 for g in spec.groups}, max_seq_len=16 * tpb)
    prompt = list(range(1000, 1000 + 5 * tpb - 4))
    serve_prompt(m, 0, prompt)
    generated = [7, 8, 9, 10]  # the ids of positions len(prompt).. as each is computed
    for token in generated:
        assert m.advance(0, token)
    assert m.advance(0, None) and m.history(0) == 5 * tpb + 1  # one more step: the boundary is behind
    m.free(0)
    # without the snapshot at history 5 * tpb the state group would allow no hit at all
    assert m.create(1, prompt + generated + [11, 12]) == 5 * tpb
    m.check_integrity()
