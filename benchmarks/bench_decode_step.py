"""The decode step of two kvpool trees in one process: this checkout's `src` and
a base tree (`--base`, default `$KV_BASE_SRC` or /tmp/b0/src, e.g. made by
`git archive b34974a src | tar -x -C /tmp/b0`).

Both trees are imported under the name `kvpool`, each with its own modules
(swapped into `sys.modules` while its runs execute), so the two managers run
the same workloads interleaved, on the same machine state.

Workloads, as benchmarks/peers/bench_kvpool.py (256 requests, 1,000-token
prompts, 16-token pages, 200 decode steps, the same pool sizes): W1 (full
attention) and W3 (full + sliding 512), reuse off and on. Three ways of calling: `req`, one
`advance(rid[, token])` per request (after a first `resize`), `batch`, one
`extend(rids, 1)` per step, and `many`, one `resize_many(rids, capacities,
histories)` per step (lists). Steps are timed one by one and split into the
steps where pages move (every request crosses a page boundary together, every
16th step) and the no-move steps. Prints, per row, the medians over
`--repeat` runs of each tree's median step (us per 256-request step) and the
ratio old/new (> 1: the new tree is faster), and the machine.

Run: `python benchmarks/bench_decode_step.py [--repeat 5] [--only 'W1 off/batch,...'] [--profile ROW]`.
`--profile ROW` runs that row of the new tree under cProfile instead.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np

BATCH, PROMPT, STEPS, TPB, WINDOW = 256, 1000, 200, 16, 512
HERE = os.path.dirname(os.path.abspath(__file__))


def load(src: str) -> dict[str, ModuleType]:
    """Import the `kvpool` of tree `src` and take its modules out of `sys.modules`."""
    for name in [k for k in sys.modules if k == "kvpool" or k.startswith("kvpool.")]:
        del sys.modules[name]
    sys.path.insert(0, src)
    try:
        import kvpool.cache  # noqa: F401
        import kvpool.plan  # noqa: F401
        import kvpool.spec  # noqa: F401
    finally:
        sys.path.remove(src)
    return {k: sys.modules.pop(k) for k in list(sys.modules) if k == "kvpool" or k.startswith("kvpool.")}


@contextmanager
def active(mods: dict[str, ModuleType]) -> Iterator[None]:
    """`mods` as the `kvpool` modules (a lazy import inside a call finds its own tree)."""
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k in mods:
            sys.modules.pop(k, None)


def make(mods: dict[str, ModuleType], sliding: bool, reuse: bool) -> Any:
    config: dict[str, Any] = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "hidden_size": 1024,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "bfloat16",
    }
    if sliding:
        config |= {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": WINDOW}
    spec = mods["kvpool.spec"].load_model_spec(config, tokens_per_block=TPB)
    # as the peer benchmark: the full group holds every page, the sliding one its peak (right after admission)
    # and 64 more, so with reuse on its free stack runs dry and the cached pages that left the window are evicted
    pages = {"full": BATCH * -(-(PROMPT + STEPS) // TPB) + 64, "sliding": BATCH * -(-PROMPT // TPB) + 64}
    pages = {g.name: pages[g.name] for g in spec.groups}
    limits = mods["kvpool.plan"].ServingLimits(max_batch_size=BATCH, max_seq_len=8192)
    plan = mods["kvpool.plan"].PoolPlan.from_pages(spec, pages, limits)
    return mods["kvpool.cache"].KVCacheManager(plan, enable_reuse=reuse, events=False)


def run(mods: dict[str, ModuleType], sliding: bool, reuse: bool, batch: bool | str) -> tuple[list[float], list[float]]:
    """(µs of each step where pages move, µs of each no-move step)."""
    m = make(mods, sliding, reuse)
    rids = list(range(BATCH))
    for rid in rids:
        prompt = list(range(rid * 10_000, rid * 10_000 + PROMPT))
        hit = m.create(rid, prompt)
        assert m.resize(rid, PROMPT, hit)
        if reuse:
            assert m.resize(rid, PROMPT, PROMPT)
            m.commit(rid, PROMPT)
    assert m.resize_many(rids, [PROMPT + 1] * BATCH, [PROMPT] * BATCH)
    moving: list[float] = []
    still: list[float] = []
    free = [m.free_pages(g.name) for g in m.groups]
    advance, extend, clock = m.advance, m.extend, time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for step in range(2, STEPS + 1):
            t0 = clock()
            if batch == "many":  # the shapes given, as a scheduler that tracks them passes them
                assert m.resize_many(rids, [PROMPT + step] * BATCH, [PROMPT + step - 1] * BATCH)
            elif batch:
                assert extend(rids, 1)
            elif reuse:
                for rid in rids:
                    advance(rid, rid * 10_000 + PROMPT + step - 2)
            else:
                for rid in rids:
                    advance(rid)
            dt = (clock() - t0) * 1e6
            now = [m.free_pages(g.name) for g in m.groups]
            (moving if now != free else still).append(dt)
            free = now
    finally:
        gc.enable()
    assert m.capacity(0) == PROMPT + STEPS
    m.check_integrity()
    return moving, still


MODES: dict[str, bool | str] = {"req": False, "batch": True, "many": "many"}
ROWS: dict[str, tuple[bool, bool, bool | str]] = {
    f"{w} {'on' if reuse else 'off'}/{mode}": (w == "W3", reuse, MODES[mode])
    for w in ("W1", "W3")
    for reuse in (False, True)
    for mode in MODES
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=os.environ.get("KV_BASE_SRC", "/tmp/b0/src"), help="the old tree's src")
    parser.add_argument("--repeat", type=int, default=5, help="runs per tree and row, interleaved")
    parser.add_argument("--only", default="", help="comma-separated rows, e.g. 'W1 off/batch,W3 on/req'")
    parser.add_argument("--profile", default="", help="cProfile this row of the new tree instead")
    args = parser.parse_args()
    new = load(os.path.join(HERE, "..", "src"))
    if args.profile:
        import cProfile
        import pstats

        sliding, reuse, batch = ROWS[args.profile]
        with active(new):
            prof = cProfile.Profile()
            prof.runcall(lambda: [run(new, sliding, reuse, batch) for _ in range(args.repeat)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    old = load(args.base)
    rows = [r.strip() for r in args.only.split(",") if r.strip()] or list(ROWS)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
        f"Python {platform.python_version()}, NumPy {np.__version__}"
    )
    print(f"old: {args.base}   new: {os.path.normpath(os.path.join(HERE, '..', 'src'))}")
    print(f"{BATCH} requests x {PROMPT}-token prompts, {STEPS} decode steps, {TPB}-token pages; us per step,")
    print(f"median over {args.repeat} interleaved runs of each run's median; ratio = old/new (> 1: new faster)")
    print(f"{'row':<14} {'move old':>9} {'move new':>9} {'ratio':>6}   {'still old':>9} {'still new':>9} {'ratio':>6}")
    for row in rows:
        sliding, reuse, batch = ROWS[row]
        res: dict[str, tuple[list[float], list[float]]] = {"old": ([], []), "new": ([], [])}
        for _ in range(args.repeat):
            for name, mods in (("old", old), ("new", new)):
                with active(mods):
                    moving, still = run(mods, sliding, reuse, batch)
                res[name][0].append(statistics.median(moving))
                res[name][1].append(statistics.median(still))
        (mo, so), (mn, sn) = ([statistics.median(v) for v in res[name]] for name in ("old", "new"))
        print(f"{row:<14} {mo:>9.1f} {mn:>9.1f} {mo / mn:>6.2f}   {so:>9.1f} {sn:>9.1f} {so / sn:>6.2f}")


if __name__ == "__main__":
    main()
