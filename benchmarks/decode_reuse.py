"""Prefix reuse that committing decode pages as they fill buys on multi-turn chat.

A synthetic multi-turn chat trace with token ids: conversations on a few
shared system prompts, each turn's prompt = every earlier message and output
of its conversation plus a new user message. Turn k + 1 arrives when the
recorded server finished turn k plus a think time, the recorded server
decoding `--speed` times as fast as the replayed one (one scheduler step =
`--step-ms`): at speed 1 or below a follow-up finds its predecessor done; above
it, the follow-up arrives while its predecessor still generates, as happens when
a trace recorded on a fast server is replayed on a slower deployment.

Each request samples its own output (the tokens the next turn's prompt holds),
through the shared scheduler and the real manager. No timing: the hit rate is
exact page arithmetic. The same script runs on any kvpool tree, so it compares
the commit-at-finish scheduler with the commit-as-it-fills one:
`PYTHONPATH=<old>/src python benchmarks/decode_reuse.py` against
`python benchmarks/decode_reuse.py` (`--speed 1,2,4`, `--conversations 60`).
"""

from __future__ import annotations

import argparse
import heapq
import platform
import random

from kvpool.plan import PoolPlan, ServingLimits
from kvpool.sched import Sequence, session
from kvpool.spec import load_model_spec


def chat(conversations: int, turns: int, seed: int) -> list[tuple[int, list[int], list[int], float]]:
    """(conversation, prompt, output, think seconds before it) per turn, in conversation order."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, 50_000) for _ in range(rng.randrange(lo, hi))]

    systems = [text(200, 800) for _ in range(4)]
    out = []
    for c in range(conversations):
        history = list(rng.choice(systems))
        for _ in range(rng.randrange(2, turns + 1)):
            prompt = history + text(20, 200)
            output = text(50, 600)
            out.append((c, prompt, output, rng.uniform(0.5, 8.0)))
            history = prompt + output
    return out


def replay(speed: float, step_s: float, conversations: int, turns: int, seed: int) -> dict[str, float]:
    spec = load_model_spec("llama-3.1-8b-instruct", tokens_per_block=16)
    limits = ServingLimits(max_batch_size=32, max_seq_len=32768, max_num_tokens=2048)
    manager, scheduler, _ = session(PoolPlan.from_pages(spec, {"full": 6000}, limits))
    trace = chat(conversations, turns, seed)
    rng = random.Random(seed + 1)
    # arrivals: a conversation's first turn at a random time, each next one when the recorded server
    # (`speed` times faster) finished the previous turn, plus the think time
    arrivals: list[tuple[float, int]] = []
    starts: dict[int, float] = {}
    for rid, (c, _, output, think) in enumerate(trace):
        at = starts.get(c, rng.uniform(0, 60.0))
        arrivals.append((at, rid))
        starts[c] = at + len(output) * step_s / speed + think
    heapq.heapify(arrivals)
    outputs = {rid: t[2] for rid, t in enumerate(trace)}
    finished_at: dict[int, float] = {}
    overlapping = 0
    now = 0.0
    while arrivals or scheduler.has_work():
        while arrivals and arrivals[0][0] <= now:
            _, rid = heapq.heappop(arrivals)
            c = trace[rid][0]
            previous = rid - 1 if rid and trace[rid - 1][0] == c else None
            overlapping += previous is not None and previous not in finished_at
            scheduler.add(Sequence(rid, trace[rid][1], len(outputs[rid])))
        step = scheduler.schedule()
        if step is None or step.is_empty:
            now = arrivals[0][0] if arrivals else now + step_s
            continue
        sampled = {s.rid: [outputs[s.rid][len(s.output_ids)]] for s, _ in step.decodes}
        for s, start, n in step.prefills:
            if start + n == s.num_tokens:
                sampled[s.rid] = [outputs[s.rid][0]]
        for seq in scheduler.update(step, sampled):
            finished_at[seq.rid] = now
        now += step_s
    stats = manager.stats()
    follow_ups = sum(1 for rid in range(1, len(trace)) if trace[rid - 1][0] == trace[rid][0])
    return {
        "requests": len(trace),
        "follow-ups": follow_ups,
        "arrived while the previous turn ran": overlapping,
        "prompt tokens": stats.reuse_queried_tokens,
        "reused": stats.reuse_hit_tokens,
        "hit rate": stats.hit_rate,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", default="0.5,1,2,4", help="recorded server's decode speed / the replayed one's")
    ap.add_argument("--step-ms", type=float, default=25.0)
    ap.add_argument("--conversations", type=int, default=60)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--seed", type=int, default=36)
    args = ap.parse_args()
    print(f"# {platform.machine()}, Python {platform.python_version()}; llama-3.1-8b, 16-token pages, 6,000 pages")
    for speed in (float(x) for x in args.speed.split(",")):
        r = replay(speed, args.step_ms / 1000, args.conversations, args.turns, args.seed)
        print(
            f"speed {speed:g}: {r['requests']} requests, {r['follow-ups']} follow-ups, "
            f"{r['arrived while the previous turn ran']} arrived while the previous turn ran; "
            f"prompt tokens {r['prompt tokens']:,}, reused {r['reused']:,} ({r['hit rate']:.1%})"
        )


if __name__ == "__main__":
    main()
