"""Workloads for the fleet's comparison with Dynamo's mocker (and the
published prefill/decode results): fixed shapes at Poisson arrivals (1K/1K,
8K/256), and multi-turn chat whose conversations share a few system prompts.
Traces with Mooncake-style block ids (`hash_block_tokens` per block), so that
both simulators see the same prefixes."""

from __future__ import annotations

import numpy as np

from kvpool.trace import Trace


def fixed(n: int, prompt: int, output: int, rate: float, *, block: int = 512, seed: int = 0) -> Trace:
    """`n` requests of `prompt` tokens (each its own blocks: nothing shared) and
    `output` tokens, Poisson arrivals at `rate` per second."""
    per = -(-prompt // block)
    hashes = tuple(tuple(range(i * per, (i + 1) * per)) for i in range(n))
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return Trace(
        f"{prompt}/{output}",
        np.full(n, prompt, dtype=np.int64),
        np.full(n, output, dtype=np.int64),
        np.cumsum(gaps),
        hashes,
        block,
    )


def chat(
    conversations: int,
    turns: int,
    *,
    systems: int = 4,
    system_blocks: int = 8,
    turn_blocks: int = 1,
    output: int = 128,
    rate: float = 4.0,
    block: int = 512,
    seed: int = 0,
) -> Trace:
    """Multi-turn chat: each conversation starts from one of `systems` shared
    system prompts (`system_blocks` blocks), and each turn's prompt is the
    whole conversation so far plus `turn_blocks` new blocks; `output` tokens a
    turn. Conversations start at Poisson times at `rate` per second and take a
    turn every 5 seconds (the user reads), so turns of different
    conversations interleave."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1.0 / rate, conversations))
    rows: list[tuple[float, tuple[int, ...]]] = []
    fresh = 1_000_000
    for c in range(conversations):
        system = int(rng.integers(systems))
        history = list(range(system * system_blocks, (system + 1) * system_blocks))
        for t in range(turns):
            history += list(range(fresh, fresh + turn_blocks))
            fresh += turn_blocks
            rows.append((float(starts[c]) + 5.0 * t, tuple(history)))
    rows.sort(key=lambda r: r[0])
    times = np.array([r[0] for r in rows])
    return Trace(
        "chat",
        np.array([block * len(r[1]) for r in rows], dtype=np.int64),
        np.full(len(rows), output, dtype=np.int64),
        times - times[0],
        tuple(r[1] for r in rows),
        block,
    )
