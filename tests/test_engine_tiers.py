"""The reference engine with a host tier (torch_engine/kv_store.py `HostTier`): a
prefix whose pages the GPU pool had to evict comes back from host memory, and
greedy output still equals transformers' generate token for token."""

from __future__ import annotations

import pytest

from engine_helpers import SHARED, assert_same_tokens, hf_greedy, manual_plan, prompts, tiny, tiny_spec
from kvpool.torch_engine.runner import Engine, Output

MAX_NEW = 20


def serve_in_turn(engine: Engine, batch: list[list[int]], eos: int) -> list[Output]:
    """Serve each prompt alone, one after another."""
    return [engine.generate([p], MAX_NEW, eos_token_id=eos)[0] for p in batch]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_an_evicted_prefix_comes_back_from_host_memory_and_decodes_the_same(arch: str) -> None:
    model, hf, config = tiny(arch)
    eos = config["eos_token_id"]
    a, b = prompts()[4], prompts()[5]  # share a 23-token prefix: 5 whole 4-token pages
    assert a[:SHARED] == b[:SHARED]
    fillers = [prompts()[3], [t + 1 for t in prompts()[3]]]  # unrelated 30-token prompts

    def engine(host_memory: int) -> Engine:
        # 24 pages of 4 tokens: a filler (30 + 20 tokens = 13 pages) plus the padding dummy leaves
        # too little for a's cached pages to survive two fillers
        plan = manual_plan(tiny_spec(config), 24, max_batch_size=2, max_seq_len=64, max_num_tokens=16)
        return Engine(model, plan, host_memory=host_memory)

    without = engine(0)
    assert serve_in_turn(without, [a, *fillers, b], eos)[-1].num_cached == 0  # evicted and gone: all recomputed
    page_bytes = manual_plan(tiny_spec(config), 1).total_bytes
    tiered = engine(64 * page_bytes)
    outs = serve_in_turn(tiered, [a, *fillers, b], eos)
    assert outs[-1].num_cached == 20  # the 5 shared pages, copied back from host memory
    assert tiered.host is not None and tiered.host.offloaded > 0 and tiered.host.onboarded >= 5
    for prompt, out in zip([a, *fillers, b], outs, strict=True):
        assert_same_tokens(out.output_ids, hf_greedy(hf, prompt, MAX_NEW, eos), f"{arch}: with a host tier")
    tiered.manager.check_integrity()
