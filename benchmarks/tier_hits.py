"""Prefix hits a host tier buys: the Mooncake conversation trace's prompts
(real prefix structure: its `hash_ids`) served one after another through
`KVCacheManager` on a small GPU pool, with host tiers of several sizes.

Each request: `create` (the prefix lookup: GPU pages, then the host tier's,
copied back), prefill, `commit` of the prompt, `free` (its pages stay cached
and go to the host tier when the GPU pool evicts them). No timing: the hit
rate is exact page arithmetic. Run:
`python benchmarks/tier_hits.py [--model qwen3-8b] [--gpu-gib 2] [--host-gib 0,4,16,64] [--requests 2000]`.
"""

from __future__ import annotations

import argparse
import platform

from kvpool.cache import KVCacheManager, TierSpec
from kvpool.media import Medium
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.presets.traces import load_trace
from kvpool.sim.requests import prompt_ids
from kvpool.spec import load_model_spec

GiB = 1 << 30


def replay(plan: PoolPlan, prompts: list[list[int]], host_bytes: int) -> tuple[float, int, int]:
    """(hit rate, pages offloaded to the host tier, pages copied back from it) over `prompts`."""
    tiers = [TierSpec(Medium.CPU, host_bytes)] if host_bytes else []
    m = KVCacheManager(plan, tiers=tiers)
    queried = hit = offloaded = onboarded = 0
    for rid, prompt in enumerate(prompts):
        got = m.create(rid, prompt)
        for e in m.take_events():  # a lookup stores only pages it copies back from the host
            onboarded += e.kind == "stored" and e.medium == "GPU"
            offloaded += e.kind == "stored" and e.medium == "CPU"
        if m.resize(rid, len(prompt) + 1, len(prompt)):  # else: a prompt longer than the whole pool
            m.commit(rid, len(prompt))
            queried, hit = queried + len(prompt), hit + got
        m.free(rid)
        offloaded += sum(e.kind == "stored" and e.medium == "CPU" for e in m.take_events())
    return hit / queried if queried else 0.0, offloaded, onboarded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--gpu-gib", type=float, default=2.0)
    ap.add_argument("--host-gib", default="0,2,8,32")
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    spec = load_model_spec(args.model, tokens_per_block=32)
    plan = plan_pools(spec, ServingLimits(max_seq_len=131072), kv_memory_bytes=int(args.gpu_gib * GiB))
    trace = load_trace("mooncake-conv", max_requests=args.requests)
    prompts = [prompt_ids(trace, i) for i in range(len(trace.prompt_len))]
    print(
        f"{platform.machine()} {platform.python_version()}; {args.model}, GPU KV {args.gpu_gib:g} GiB "
        f"({plan.pages(spec.groups[0].name)} pages of {spec.tokens_per_block} tokens), "
        f"mooncake-conv x {len(prompts)} prompts, served one at a time"
    )
    print(f"{'host GiB':>9}  {'hit rate':>8}  {'pages offloaded':>15}  {'pages copied back':>17}")
    for gib in (float(x) for x in args.host_gib.split(",")):
        rate, offloaded, onboarded = replay(plan, prompts, int(gib * GiB))
        print(f"{gib:>9g}  {rate:>8.1%}  {offloaded:>15,}  {onboarded:>17,}")


if __name__ == "__main__":
    main()
