"""The `prefix` router: SGLang's cache-aware rule on an approximate
per-worker prefix tree that the router builds from its own decisions (sgl-router
`policies/cache_aware.rs` and `tree.rs`, the default policy of
`sglang_router.launch_router`); it never sees the workers' caches.

SGLang's tree holds the request text character by character; this one holds
prompt blocks of `block_size` tokens (chained keys, as `kvpool.index` keys
them), so a match counts whole blocks: a prompt's partial last block never
matches. Each worker's blocks are kept in LRU order and trimmed to
`max_tree_tokens` every `eviction_interval_s` of simulated time, least recently
routed first (SGLang's eviction thread: `evict_tenant_by_size(max_tree_size)`
every `eviction_interval_secs`; its defaults 2**26 and 120 s, `router_args.py`).
A block's ancestors are touched after it on every insert, so eviction removes
leaves before their parents and every worker's blocks stay whole prefixes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvpool.fleet.load import RouteRequest, RouterError
from kvpool.fleet.routers import CacheAware, Router
from kvpool.units import is_positive_int

# sglang_router's defaults (router_args.py: eviction_interval_secs 120, max_tree_size 2**26)
EVICTION_INTERVAL_S = 120.0
MAX_TREE_TOKENS = 2**26


class ApproxTree:
    """Per worker, the prompt blocks routed to it (LRU order, oldest first),
    and for each block the workers believed to hold it."""

    def __init__(self, workers: int, block_size: int) -> None:
        self.block_size = block_size
        self.held: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(workers)]
        self.holders: dict[int, set[int]] = {}

    def matched(self, keys: Sequence[int]) -> list[int]:
        """Tokens of the chain `keys` each worker is believed to hold (whole blocks)."""
        out = [0] * len(self.held)
        live: set[int] | None = None
        for i, key in enumerate(keys):
            held = self.holders.get(key)
            if not held:
                break
            live = set(held) if live is None else live & held
            if not live:
                break
            for w in live:
                out[w] = (i + 1) * self.block_size
        return out

    def tokens(self, worker: int) -> int:
        """Tokens in `worker`'s tree (SGLang's tenant size, for the "smallest tree")."""
        return len(self.held[worker]) * self.block_size

    def insert(self, worker: int, keys: Sequence[int]) -> None:
        """`worker` now holds the chain `keys`; the root is touched last (most recent)."""
        held = self.held[worker]
        for key in reversed(keys):
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
                self.holders.setdefault(key, set()).add(worker)

    def evict(self, max_tokens: int) -> None:
        """Trim every worker's tree to `max_tokens`, least recently routed blocks first."""
        limit = max_tokens // self.block_size
        for worker, held in enumerate(self.held):
            while len(held) > limit:
                key, _ = held.popitem(last=False)
                holders = self.holders[key]
                holders.discard(worker)
                if not holders:
                    del self.holders[key]


class PrefixRouter(Router):
    """SGLang's cache-aware routing on an approximate tree (module docstring).
    `route` inserts the prompt into the chosen worker's tree, whichever branch
    of the rule chose it (SGLang updates the tree in the imbalanced branch too)."""

    name = "prefix"

    def __init__(
        self,
        workers: int,
        block_size: int = 16,
        cache_threshold: float = CacheAware.cache_threshold,
        balance_abs_threshold: int = CacheAware.balance_abs_threshold,
        balance_rel_threshold: float = CacheAware.balance_rel_threshold,
        eviction_interval_s: float = EVICTION_INTERVAL_S,
        max_tree_tokens: int = MAX_TREE_TOKENS,
    ) -> None:
        super().__init__(workers)
        if not is_positive_int(block_size) or not is_positive_int(max_tree_tokens) or not eviction_interval_s > 0:
            raise RouterError(
                "block_size and max_tree_tokens must be positive ints and eviction_interval_s positive, got "
                f"{block_size!r}, {max_tree_tokens!r}, {eviction_interval_s!r}"
            )
        self.rule = CacheAware(cache_threshold, balance_abs_threshold, balance_rel_threshold)
        self.tree = ApproxTree(workers, block_size)
        self.max_tree_tokens = max_tree_tokens
        self.eviction_interval_s = eviction_interval_s
        self.next_eviction = eviction_interval_s

    def choose(self, request: RouteRequest, now: float) -> int:
        keys = request.block_keys(self.tree.block_size)
        sizes = [self.tree.tokens(w) for w in range(self.workers)]
        return self.rule.choose(self.loads.requests, self.tree.matched(keys), len(request.token_ids), sizes)

    def advance(self, now: float) -> None:
        if now >= self.next_eviction:  # SGLang's eviction thread has woken since the last request
            self.tree.evict(self.max_tree_tokens)
            self.next_eviction = (now // self.eviction_interval_s + 1) * self.eviction_interval_s

    def record(self, worker: int, request: RouteRequest, now: float) -> None:
        super().record(worker, request, now)
        self.tree.insert(worker, request.block_keys(self.tree.block_size))
