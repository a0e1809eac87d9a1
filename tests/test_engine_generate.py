"""Greedy generation on the paged engine equals transformers' generate.

Every run: tiny random-weight models (weights copied from the transformers
model), 4-token pages, chunked prefill with a 16-token budget, 8 prompts of
3..35 tokens (four share a 23-token prefix = 5 whole pages, so later ones hit
the prefix cache), 20 new tokens so requests cross page edges and the
sliding windows (Mistral 12, Gemma 3 10). Tokens must match exactly; the
logits that chose each request's last token within LOGIT_ATOL.
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine_helpers import (
    MAX_NEW,
    SHARED,
    assert_close_logits,
    assert_same_tokens,
    manual_plan,
    prompts,
    tiny,
    tiny_spec,
)
from kvpool.torch_engine.arch import StalePageError
from kvpool.torch_engine.names import ARCHS
from kvpool.torch_engine.runner import Engine


@functools.cache
def reference(arch: str, prompt: tuple[int, ...]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the logits of its last step."""
    _, hf, config = tiny(arch)
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=MAX_NEW,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=config["eos_token_id"],
    )
    return out.sequences[0, len(prompt) :].tolist(), out.logits[-1][0]


def run_engine(arch: str, pages: int = 200, speculate: int = 0, **kw: object) -> Engine:
    model, _, config = tiny(arch)
    plan = manual_plan(tiny_spec(config), pages, max_batch_size=8, max_seq_len=64, max_num_tokens=16, max_draft_len=3)
    engine = Engine(model, plan, speculate=speculate, **kw)  # type: ignore[arg-type]
    outputs = engine.generate(prompts(), MAX_NEW, eos_token_id=config["eos_token_id"])
    for i, (prompt, out) in enumerate(zip(prompts(), outputs, strict=True)):
        want_tokens, want_logits = reference(arch, tuple(prompt))
        assert_same_tokens(out.output_ids, want_tokens, f"{arch} request {i}")
        assert out.last_logits is not None
        assert_close_logits(out.last_logits, want_logits, f"{arch} request {i} last step")
    assert_no_leak(engine)
    return engine


def assert_no_leak(engine: Engine) -> None:
    """After a run only the persistent padding dummies hold pages."""
    engine.manager.check_integrity()
    report = engine.warmup_report
    for g in engine.spec.groups:
        reserved = report.reserved_pages[g.name] if report is not None else 0
        used = engine.manager.total_pages(g.name) - engine.manager.free_pages(g.name)
        assert used == reserved, f"group {g.name}: {used} pages held after the run, {reserved} reserved"


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_parity(arch: str) -> None:
    engine = run_engine(arch)
    # Which shared-prefix prompts find the prefix committed depends on the step
    # they are admitted in; at least one does (exact count: test_reuse_hit_exact).
    assert engine.kv_report()["reuse_hit_tokens"] > 0
    assert engine.stats.padding_rows > 0  # e.g. a decode batch of 3 pads to 4


def test_reuse_hit_exact() -> None:
    # Request A (24 tokens) finishes first; B shares A's first 23 tokens. Whole
    # 4-token pages of the shared part: floor(23 / 4) = 5 pages = 20 tokens.
    model, _, config = tiny("llama")
    plan = manual_plan(tiny_spec(config), 100, max_batch_size=8, max_seq_len=64, max_num_tokens=16)
    engine = Engine(model, plan)
    a, b = prompts()[4], prompts()[5]
    assert a[:SHARED] == b[:SHARED] and a[SHARED] != b[SHARED]
    engine.generate([a], MAX_NEW, eos_token_id=config["eos_token_id"])
    before = engine.manager.stats().reuse_hit_tokens
    out = engine.generate([b], MAX_NEW, eos_token_id=config["eos_token_id"])[0]
    assert engine.manager.stats().reuse_hit_tokens - before == 20
    assert out.num_cached == 20
    assert_same_tokens(out.output_ids, reference("llama", tuple(b))[0], "reused request")
    assert_no_leak(engine)


@pytest.mark.parametrize("speculate", [0, 3])
def test_any_of_several_eos_ids_stops_like_transformers(speculate: int) -> None:
    # Llama 3 instruct checkpoints list several stop ids: generation must end at
    # the first of any of them (it used to stop only at the first listed id).
    model, hf, config = tiny("llama")
    prompt = prompts()[3]
    free_run = reference("llama", tuple(prompt))[0]
    stop = free_run[2]
    assert stop not in free_run[:2]
    eos = [255 if stop != 255 else 254, stop]  # the first id is never generated early
    ids = torch.tensor([prompt])
    want = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=MAX_NEW,
        pad_token_id=0,
        eos_token_id=eos,
    )[0, len(prompt) :].tolist()
    assert want == free_run[:3]
    plan = manual_plan(tiny_spec(config), 100, max_batch_size=8, max_seq_len=64, max_num_tokens=16, max_draft_len=3)
    engine = Engine(model, plan, speculate=speculate)
    out = engine.generate([prompt], MAX_NEW, eos_token_id=eos)[0]
    assert_same_tokens(out.output_ids, want, "several eos ids")
    assert_no_leak(engine)


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_parity(arch: str) -> None:
    engine = run_engine(arch, speculate=3)
    assert engine.stats.draft_proposed > 0
    assert 0 < engine.stats.draft_accepted < engine.stats.draft_proposed  # some rejected, rewound


@pytest.mark.parametrize("arch", ARCHS)
def test_preemption_parity(arch: str) -> None:
    # 30 pages of 4 tokens: the 8 requests need up to ceil(55 / 4) = 14 pages
    # each in a full group, so the pool cannot hold them together.
    engine = run_engine(arch, pages=30, speculate=3 if arch in ("llama", "gemma3") else 0)
    assert engine.stats.preemptions > 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_static_decode_path_parity(arch: str) -> None:
    # The CUDA-graph path on static buffers, run eagerly on CPU.
    engine = run_engine(arch, cuda_graphs=True)
    assert engine.stats.graph_steps > 0


def test_static_decode_width_follows_the_requests_not_max_seq_len() -> None:
    # 8 requests of 20 + 12 tokens under max_seq_len 8192, 16-token pages: the
    # graph buffers for the full-attention group must be sized by the longest
    # span (<= 32 positions -> a 32-key bucket), not by 8192 keys per row.
    model, _, config = tiny("llama")
    plan = manual_plan(tiny_spec(config, 16), 400, max_batch_size=8, max_seq_len=8192, max_num_tokens=256)
    engine = Engine(model, plan, cuda_graphs=True)
    outs = engine.generate([[1, 2, 3, 4, 5] * 4] * 8, 12)
    eager = Engine(model, plan).generate([[1, 2, 3, 4, 5] * 4] * 8, 12)
    assert [o.output_ids for o in outs] == [o.output_ids for o in eager]
    assert engine.graphs is not None and engine.stats.graph_steps > 0
    widths = {s.index["full"].read_pages.shape[1] for s in engine.graphs.shapes.values()}
    assert widths and max(widths) <= 32, widths
    assert engine.graphs.width_bucket(33) == 64 and engine.graphs.width_bucket(10**6) == 8192


@pytest.mark.parametrize("options", [{"padding": False}, {"warmup": False}])
def test_lazy_padding_and_no_warmup_parity(options: dict[str, bool]) -> None:
    # padding=False: the scheduler asks for a fresh padding dummy each padded
    # step (history = its draft length, not 0); warmup=False: nothing captured,
    # so no step pads at all.
    engine = run_engine("gemma3", **options)
    assert (engine.stats.padding_rows > 0) == options.get("warmup", True)


def test_sliding_page_released_one_step_early_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # A deliberately broken manager that releases sliding pages one step early:
    # stale(h) computed as stale(h + 1). Attention must notice.
    import sys

    import kvpool.spec.pages as pages

    correct = pages.stale_pages

    def early(group, history):  # type: ignore[no-untyped-def]
        return correct(group, history + 1)

    for name, module in list(sys.modules.items()):
        if name.startswith("kvpool.") and getattr(module, "stale_pages", None) is correct:
            monkeypatch.setattr(module, "stale_pages", early)
    with pytest.raises(StalePageError, match="released"):
        run_engine("mistral")
