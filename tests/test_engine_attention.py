"""Paged attention over hand-made block tables equals dense attention; masks;
storage bytes equal the plan's; a stale page that is still needed is caught."""

# mypy: disable-error-code="no-untyped-call,no-any-return"
# (transformers and tokenizers are untyped: these call them and return what they give)
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine_helpers import assert_close_logits, manual_plan, tiny, tiny_spec
from kvpool.spec import stale_pages
from kvpool.torch_engine.arch import EngineError, StalePageError
from kvpool.torch_engine.attention import PagedBatch, Row, attention_mask
from kvpool.torch_engine.kv_store import KVStore
from kvpool.torch_engine.names import ARCHS


def test_masks_by_hand() -> None:
    q = torch.tensor([5])
    k = torch.arange(8)
    # full: keys 0..5; sliding(3): 3,4,5 (q - 3 < k <= q); chunked(4): 4,5 (same chunk as 5).
    assert attention_mask("full", None, q, k)[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert attention_mask("sliding", 3, q, k)[0].nonzero().flatten().tolist() == [3, 4, 5]
    assert attention_mask("chunked", 4, q, k)[0].nonzero().flatten().tolist() == [4, 5]


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_store_bytes_equal_plan(arch: str) -> None:
    model, _, config = tiny(arch)
    spec = tiny_spec(config)
    plan = manual_plan(spec, pages=7)
    store = KVStore(plan, model.cfg, torch.float32)
    # One page = tpb 4 x layers x (K + V) x 2 kv heads x 16 dims x 4 bytes.
    layers = {"mistral": {"sliding": 2}, "gemma3": {"sliding": 5, "full": 1}}[arch]
    for name, n in layers.items():
        assert plan.group(name).page_bytes == 4 * n * 2 * 2 * 16 * 4
        assert store.tensors[name].numel() * 4 == 7 * plan.group(name).page_bytes
    assert store.total_bytes == plan.total_bytes


def test_store_refuses_a_plan_in_another_dtype() -> None:
    model, _, config = tiny("llama")
    plan = manual_plan(tiny_spec(config), pages=4)  # fp32 plan
    with pytest.raises(EngineError, match="bytes allocated"):
        KVStore(plan, model.cfg, torch.float16)


def _run_chunks(arch: str, chunks: list[int], release_early: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed one 30-token sequence through pages in scrambled order, chunk by
    chunk, marking stale pages (sliding groups) with -1 as the manager would;
    `release_early` pretends history is that much further on. Returns (paged
    logits at every position, dense logits)."""
    model, _, config = tiny(arch)
    spec = tiny_spec(config)
    plan = manual_plan(spec, pages=16)
    store = KVStore(plan, model.cfg, torch.float32)
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(3, 256, 30))
    tables = {g.name: rng.permutation(16)[:8].astype(np.int32) for g in spec.groups}
    out = []
    start = 0
    with torch.no_grad():
        for n in chunks:
            live = {}
            for g in spec.groups:
                t = tables[g.name].copy()
                t[: stale_pages(g, start + release_early)] = -1
                live[g.name] = t
            batch = PagedBatch([Row(start, n, live)], spec.groups, {g.name: 16 for g in spec.groups})

            def attend(layer, q, k, v, batch=batch):  # type: ignore[no-untyped-def]
                return batch.attend(
                    store.group_of_layer[layer],
                    store.layer(layer),
                    q,
                    k,
                    v,
                    model.cfg.attn_scale,
                    model.cfg.attn_logit_softcap,
                )

            out.append(model(ids[start : start + n], batch.positions, attend))
            start += n
    return torch.cat(out), model.dense_logits(ids)


@pytest.mark.parametrize("arch", ARCHS)
def test_paged_chunks_equal_dense(arch: str) -> None:
    # 30 tokens = 7 + 6 + 1 * 5 + 12: chunk edges off page edges, single-token
    # decodes, and a long last chunk that crosses the sliding windows (10, 12).
    got, want = _run_chunks(arch, [7, 6, 1, 1, 1, 1, 1, 12])
    assert_close_logits(got, want, f"{arch} paged vs dense")


def test_one_step_early_release_is_caught() -> None:
    # Mistral window 12, 4-token pages; steps start at history 0, 14, 15, 16.
    # stale(h) = floor((h + 1 - 12) / 4): stale(14) = 0, stale(15) = 1. At
    # history 14 the query at 14 sees positions 3..14, and 3 is on page 0.
    # Releasing as if history were 15 takes page 0 away one step too early.
    _run_chunks("mistral", [14, 1, 1, 1])  # correct releases pass
    with pytest.raises(StalePageError, match="released"):
        _run_chunks("mistral", [14, 1, 1, 1], release_early=1)


def test_two_rows_in_one_step() -> None:
    # Two sequences share a step: one prefills 9 tokens from 0, the other decodes
    # at position 5 after a 5-token prefill. Each must see only its own pages.
    model, _, config = tiny("gemma3")
    spec = tiny_spec(config)
    plan = manual_plan(spec, pages=12)
    store = KVStore(plan, model.cfg, torch.float32)
    a = torch.arange(10, 19)
    b = torch.arange(100, 106)
    tab_a = {g.name: np.array([3, 7, 1], dtype=np.int32) for g in spec.groups}
    tab_b = {g.name: np.array([0, 11], dtype=np.int32) for g in spec.groups}
    pages = {g.name: 12 for g in spec.groups}

    def run(rows, ids):  # type: ignore[no-untyped-def]
        batch = PagedBatch(rows, spec.groups, pages)
        return model(
            ids,
            batch.positions,
            lambda layer, q, k, v: batch.attend(
                store.group_of_layer[layer],
                store.layer(layer),
                q,
                k,
                v,
                model.cfg.attn_scale,
                model.cfg.attn_logit_softcap,
            ),
        )

    with torch.no_grad():
        run([Row(0, 5, tab_b)], b[:5])
        logits = run([Row(0, 9, tab_a), Row(5, 1, tab_b)], torch.cat([a, b[5:]]))
    assert_close_logits(logits[:9], model.dense_logits(a), "row a")
    assert_close_logits(logits[9:], model.dense_logits(b)[5:], "row b")


@pytest.mark.parametrize(("kind", "window"), [("chunked", 8), ("sliding", 6), ("full", None)])
def test_paged_attend_matches_masked_dense(kind: str, window: int | None) -> None:
    # Raw q/k/v (no model): 22 positions fed as chunks 5, 7, 1, 9 through a
    # scrambled 4-token page table whose stale pages (chunked: pages wholly
    # before the in-flight token's chunk; sliding: behind the window) are -1.
    from kvpool.spec import LayerGroup
    from kvpool.torch_engine.attention import scaled_attention

    group = LayerGroup("g", kind, (0,), 4, row_bytes=2 * 2 * 8 * 4, window=window)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(22, h, 8, generator=gen) for h in (4, 2, 2))
    table = np.array([5, 0, 3, 7, 1, 6], dtype=np.int32)
    kv = torch.zeros(8, 2, 4, 2, 8)
    out, start = [], 0
    for n in (5, 7, 1, 9):
        live = table.copy()
        live[: stale_pages(group, start)] = -1
        batch = PagedBatch([Row(start, n, {"g": live})], [group], {"g": 8})
        out.append(batch.attend("g", kv, q[start : start + n], k[start : start + n], v[start : start + n], 0.3))
        start += n
    pos = torch.arange(22)
    mask = attention_mask(kind, window, pos, pos)[None, None]
    want = scaled_attention(q[None], k[None], v[None], mask, 0.3)[0]
    assert_close_logits(torch.cat(out), want, f"{kind} attention")
    # By hand: the last chunk starts at history 13; chunked(8) makes pages
    # wholly before chunk 8..15 stale: floor(13 / 8) * 8 / 4 = 2 pages (0..7).
    if kind == "chunked":
        assert stale_pages(group, 13) == 2


def test_a_window_as_long_as_the_positions_keeps_its_window_past_them() -> None:
    """Mistral-style `sliding_window == max_position_embeddings` (16 here): the
    default spec reads the window as full attention, which is the same for
    requests up to 16 tokens. A plan for longer requests on that spec is
    refused; a spec built for them keeps the window and matches transformers
    (which keeps the window past its positions) token for token."""
    from engine_helpers import hf_greedy
    from kvpool.spec import load_model_spec
    from kvpool.torch_engine.runner import Engine
    from kvpool.torch_engine.weights import tiny_model

    torch.set_num_threads(1)
    model, hf, config = tiny_model("mistral", 0, sliding_window=16, max_position_embeddings=16)
    assert [g.window for g in tiny_spec(config).groups] == [None]  # full attention
    with pytest.raises(EngineError, match="max_seq_len=40"):
        Engine(model, manual_plan(tiny_spec(config), 64, max_batch_size=2, max_seq_len=40))
    spec = load_model_spec(config, kv_dtype="fp32", tokens_per_block=4, max_seq_len=40)
    assert [(g.kind, g.window) for g in spec.groups] == [("sliding", 16)]
    prompt = list(range(5, 15))
    got = Engine(model, manual_plan(spec, 64, max_batch_size=2, max_seq_len=40)).generate([prompt], 30)
    assert got[0].output_ids == hf_greedy(hf, prompt, 30, eos=[])
