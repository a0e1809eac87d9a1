"""`PrefixIndex`: a router's view of many workers' KV caches, built from
their KV events, answering "for these token ids, how many tokens does each
worker hold, per tier".

Like llm-d's and Dynamo's indexers it keys blocks on their tokens, not on the
engine's hashes: a stored block's key chains the parent block's key with the
block's token ids (kvpool's page digest, `cache/hashing.py`), the first block
of a chain starting from its reuse scope (the LoRA name and the salt in block
0's `extra_keys`). Engine hashes are opaque ids that map to those keys, so
any engine's hash algorithm works and a query needs nothing but tokens.
With lookahead hashes (vLLM 0.33's `lookahead_token_ids`, sent when an
EAGLE-family drafter makes each block's hash cover the L ids after it) a key
also covers those L ids, as the engine's hash does (kvpool's `LookaheadChain`),
and a query keys each of its blocks with the L ids that follow it in the
prompt: a block counts only where the prompt goes on with the ids it was
stored with, and a prompt's last L ids complete no block (what the engine's
own lookup finds; Dynamo keys SGLang's EAGLE blocks on their page and the
next id in the same way). Each worker's L is learned from its stores.

Unlike them it knows each worker's groups and their kinds (given with
`add_worker`, or learned from `group_idx`, `kv_cache_spec_kind` and
`kv_cache_spec_sliding_window` of the stores), and answers with the reuse rule
of each kind, as kvpool's own manager does (`cache/prefix.py`): a hit of k
blocks needs blocks 0..k-1 in full (and MLA, compressed) groups, only the
blocks live at k in a sliding or chunked group, and a state snapshot at k - 1
in a state group. A hybrid model's answer is then its real reuse, not the
full-attention groups' prefix.

Tiers, as Dynamo's indexer reports them: `gpu` the tokens reusable from the
GPU alone, `cpu` with the host tier as well, `disk` with every tier (each at
least the one before). Media: GPU; CPU or CPU_PINNED; DISK or STORAGE.

Stores the index cannot follow are counted in `refused` by reason and
dropped: another block size, a span whose tokens do not cover its blocks
densely (`len(token_ids) == block_size * len(block_hashes)`, llm-d's rule),
lookahead ids that are not L per block (L the worker's, > 0), an unknown medium, a parent the index never saw (the keys of the last 65,536
blocks that left a worker are kept for their children). Not thread-safe;
`kvpool.index.subscriber` feeds it from ZMQ.
"""

from __future__ import annotations

from array import array
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.cache.hashing import LookaheadChain, ReuseScope, Salt, extend_hashes, published_scope, salt_seed
from kvpool.cache.prefix import TierHit
from kvpool.errors import KvpoolError
from kvpool.index.events import Cleared, Removed, Stored, parse_event
from kvpool.media import Medium
from kvpool.spec.groups import LayerGroup
from kvpool.spec.kinds import NEVER, KindRule, kind_rule

TIERS = tuple(Medium)
GONE = 1 << 16  # engine hashes whose keys are kept after no one holds them, per worker
MEDIUM_TIER = {None: 0, "GPU": 0, "CPU": 1, "CPU_PINNED": 1, "DISK": 2, "STORAGE": 2}
# vLLM's KVCacheSpecKind values -> kvpool's kinds (the rule of each). A kind with no reuse rule here
# (encoder-only, cross attention, unknown) is not reusable across requests: its group is ignored.
VLLM_KINDS = {
    "full_attention": "full",
    "mla_attention": "full",
    "sink_full_attention": "full",
    "sliding_window": "sliding",
    "sliding_window_mla": "sliding",
    "chunked_local_attention": "chunked",
    "mamba": "state",
}


class IndexUsageError(KvpoolError, ValueError):
    """A bad argument to the index (block size, token ids)."""


@dataclass(frozen=True)
class GroupMeta:
    """A worker's group as the index needs it (satisfies `spec.kinds.Life`):
    kvpool's kind name and the window (W, or a chunk's C; None when the events
    did not say: a chunked group then counts as full, the cautious answer)."""

    name: str
    kind: str
    tokens_per_block: int
    window: int | None = None
    ratio: int | None = None

    @property
    def rule(self) -> KindRule:
        return kind_rule("full" if self.kind == "chunked" and self.window is None else self.kind)


@dataclass
class WorkerBlocks:
    """One worker: its groups, engine hash -> [key, holders], and key ->
    {group index: tier bits (1 GPU, 2 CPU, 4 DISK)}."""

    groups: dict[int, GroupMeta] = field(default_factory=dict)
    known: bool = False  # groups given with add_worker: never learned from events
    engine: dict[Any, list[int]] = field(default_factory=dict)
    where: dict[int, dict[int, int]] = field(default_factory=dict)
    # keys of engine hashes no group or tier holds any more, newest last: a block stored after its
    # parent left everywhere (a page whose parent page was a duplicate, a tier that dropped the
    # parent first) still gets its key, and counts once the parent is stored again
    gone: OrderedDict[Any, int] = field(default_factory=OrderedDict)
    gpu_blocks: int = 0  # (key, group) pairs held on the GPU: how much the worker caches (a router's "tree size")
    ahead: int | None = None  # the lookahead ids each block's hash covers (0: none), from its first store
    # (key, group index, tier bit) -> copies held beyond the first: vLLM keeps a block that fills again
    # with a hash it already caches (a fully cached prompt recomputes its last block), and removes each
    # copy with its own BlockRemoved (`BlockHashToBlockMap`, "we don't de-duplicate the blocks")
    copies: Counter[tuple[int, int, int]] = field(default_factory=Counter)

    def key_of(self, block: Any) -> int | None:
        entry = self.engine.get(block)
        if entry is not None:
            return entry[0]
        return self.gone.get(block)

    def forget(self, block: Any, key: int) -> None:
        """`block` is held nowhere now: its key is remembered among the last `GONE` gone."""
        del self.engine[block]
        self.gone[block] = key
        self.gone.move_to_end(block)
        if len(self.gone) > GONE:
            self.gone.popitem(last=False)

    def reset(self) -> None:
        self.engine.clear()
        self.where.clear()
        self.gone.clear()
        self.gpu_blocks = 0
        self.ahead = None
        self.copies.clear()

    def holds(self, gi: int, key: int, mask: int) -> bool:
        slot = self.where.get(key)
        return slot is not None and bool(slot.get(gi, 0) & mask)


def scope_root(salt: str | None, lora: str | None) -> int:
    """The chain seed of a scope, as kvpool's manager seeds a `ReuseScope`."""
    return salt_seed(ReuseScope(salt, lora))


def event_scope(lora: str | None, extra_keys: tuple[Any, ...] | None) -> tuple[str | None, str | None]:
    """(salt, LoRA name) of a chain's first block: vLLM's block-0 `extra_keys`
    are the LoRA name, multimodal ids, the cache salt and prompt-embedding
    digests, in that order; the salt is the last string after the LoRA name."""
    first = extra_keys[0] if extra_keys else None
    if not first:
        return None, lora
    items = list(first)
    if lora is not None and items and items[0] == lora:
        items = items[1:]
    strings = [x for x in items if isinstance(x, str)]
    return (strings[-1] if strings else None), lora


def chain_keys(token_ids: Sequence[int], block_size: int, root: int, ahead: int = 0) -> list[int]:
    """The keys of the whole blocks of `token_ids` after a block with key (or
    a scope with seed) `root`; with `ahead` > 0 each also covers the `ahead`
    ids after its block, and only the blocks that many ids follow get one."""
    keys: list[int] = []
    chain = LookaheadChain(None, ahead) if ahead else None
    extend_hashes(keys, array("q", token_ids), block_size, root, len(token_ids) // block_size, chain)
    return keys


def stored_keys(e: Stored, block_size: int, root: int) -> list[int]:
    """The keys of a store's blocks after `root`: each block's ids, and with
    lookahead ids the ones the store names after it (the engine's, which
    need not be the next block's ids: the store may end a run)."""
    if not e.lookahead:
        return chain_keys(e.token_ids, block_size, root)
    chain = LookaheadChain(None, len(e.lookahead[0]))
    keys: list[int] = []
    for i, after in enumerate(e.lookahead):
        data = array("q", e.token_ids[i * block_size : (i + 1) * block_size] + after).tobytes()
        root = chain(root, data, 8 * block_size)[0]
        keys.append(root)
    return keys


def lookahead_of(e: Stored) -> int | None:
    """The ids after each block a store's hashes cover (0 without
    `lookahead_token_ids`), or None when they are not as many for each block."""
    if e.lookahead is None:
        return 0
    widths = {len(a) for a in e.lookahead}
    if len(e.lookahead) != len(e.block_hashes) or len(widths) != 1 or 0 in widths:
        return None
    return widths.pop()


def drop_tier(ws: WorkerBlocks, key: int, gi: int, bit: int) -> bool:
    """Clear tier `bit` of block `key` in group `gi` of `ws` (the block's slot
    gone with its last tier); False when it was not held there."""
    slot = ws.where.get(key)
    old = slot.get(gi, 0) if slot is not None else 0
    if not old & bit:
        return False
    assert slot is not None
    if old == bit:
        del slot[gi]
        if not slot:
            del ws.where[key]
    else:
        slot[gi] = old & ~bit
    return True


def leading_run(ws: WorkerBlocks, gi: int, keys: Sequence[int], k: int, mask: int) -> int:
    """How many of the first `k` keys group `gi` of `ws` holds in a row from
    the start, in the tiers of `mask`."""
    run = 0
    while run < k and ws.holds(gi, keys[run], mask):
        run += 1
    return run


class PrefixIndex:
    """Blocks held per worker, group and tier, from KV events (see the module
    docstring). `block_size`: the tokens per block of the events it follows
    (a store of another size is refused, as Dynamo's indexer does)."""

    def __init__(self, block_size: int) -> None:
        if type(block_size) is not int or block_size < 1:
            raise IndexUsageError(f"block_size must be a positive int, not {block_size!r}")
        self.block_size = block_size
        self.workers: dict[Hashable, WorkerBlocks] = {}
        self.refused: Counter[str] = Counter()

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker: Hashable, groups: Sequence[LayerGroup] | None = None) -> None:
        """Register `worker` (a replica's id), with its groups when known (a
        kvpool manager's `groups`); without them they are learned from its
        stores. Keeps what the worker already holds."""
        ws = self.workers.setdefault(worker, WorkerBlocks())
        if groups is not None:
            ws.groups = {
                gi: GroupMeta(g.name, g.kind, self.block_size, g.window, g.ratio) for gi, g in enumerate(groups)
            }
            ws.known = True

    def clear(self, worker: Hashable) -> None:
        """Forget what `worker` holds (its groups stay)."""
        ws = self.workers.get(worker)
        if ws is not None:
            ws.reset()

    # ------------------------------------------------------------------ events

    def apply(self, worker: Hashable, events: Iterable[Any]) -> None:
        """Apply `worker`'s events in order: decoded vLLM events (maps or
        arrays, as msgpack gives them, e.g. `kv_wire.wire_events(...)`) or
        `kvpool.index.events` records. A new worker is registered."""
        ws = self.workers.get(worker)
        if ws is None:
            ws = self.workers[worker] = WorkerBlocks()
        for raw in events:
            e = parse_event(raw)
            if isinstance(e, Stored):
                self._stored(ws, e)
            elif isinstance(e, Removed):
                self._removed(ws, e)
            else:
                assert isinstance(e, Cleared)
                ws.reset()

    def _learn(self, ws: WorkerBlocks, gi: int, e: Stored) -> None:
        if ws.known or (gi in ws.groups and e.kind is None):
            return
        kind = VLLM_KINDS.get(e.kind, "ignored") if e.kind is not None else "full"
        ws.groups[gi] = GroupMeta(f"group{gi}", kind, self.block_size, e.sliding_window)

    def _stored(self, ws: WorkerBlocks, e: Stored) -> None:
        bs = self.block_size
        if e.block_size != bs:
            self.refused["block_size"] += 1
            return
        if len(e.token_ids) != bs * len(e.block_hashes):
            self.refused["sparse"] += 1
            return
        ahead = lookahead_of(e)
        if ahead is None or ahead != (ahead if ws.ahead is None else ws.ahead):
            self.refused["lookahead"] += 1
            return
        tier = MEDIUM_TIER.get(e.medium)
        if tier is None:
            self.refused["medium"] += 1
            return
        gi = e.group_idx or 0
        self._learn(ws, gi, e)
        if e.parent is None:
            parent = scope_root(*event_scope(e.lora_name, e.extra_keys))
        else:
            known = ws.key_of(e.parent)
            if known is None:
                self.refused["orphan"] += 1
                return
            parent = known
        ws.ahead = ahead
        self._hold(ws, gi, tier, e.block_hashes, stored_keys(e, bs, parent))

    def _hold(self, ws: WorkerBlocks, gi: int, tier: int, hashes: Sequence[int | bytes], keys: Sequence[int]) -> None:
        """Worker `ws` holds the blocks of engine `hashes` (token keys `keys`) of group `gi` in `tier`."""
        bit = 1 << tier
        for h, key in zip(hashes, keys, strict=True):
            entry = ws.engine.get(h)
            if entry is None:
                entry = ws.engine[h] = [key, 0]
                ws.gone.pop(h, None)
            elif entry[0] != key:  # the engine reuses a hash for other tokens: the old holdings stay with the old key
                self.refused["rekeyed"] += 1
                entry[0], entry[1] = key, 0
            slot = ws.where.setdefault(key, {})
            old = slot.get(gi, 0)
            if old & bit:
                ws.copies[key, gi, bit] += 1
            else:
                slot[gi] = old | bit
                self._count_gpu(ws, tier, 1)
            entry[1] += 1

    def _removed(self, ws: WorkerBlocks, e: Removed) -> None:
        tier = MEDIUM_TIER.get(e.medium)
        if tier is None:
            self.refused["medium"] += 1
            return
        gi, bit = e.group_idx or 0, 1 << tier
        for h in e.block_hashes:
            entry = ws.engine.get(h)
            if entry is None:
                continue  # a block this index never saw stored (it joined late): nothing to drop
            key = entry[0]
            copies = ws.copies.pop((key, gi, bit), 0)
            if copies:  # another copy still holds it
                if copies > 1:
                    ws.copies[key, gi, bit] = copies - 1
            elif drop_tier(ws, key, gi, bit):
                self._count_gpu(ws, tier, -1)
            else:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                ws.forget(h, key)

    @staticmethod
    def _count_gpu(ws: WorkerBlocks, tier: int, delta: int) -> None:
        if tier == 0:
            ws.gpu_blocks += delta

    # ------------------------------------------------------------------ queries

    def gpu_blocks(self, worker: Hashable) -> int:
        """Blocks `worker` holds on the GPU, summed over its groups (0 for a
        worker the index does not know): SGLang's "smallest tree" reads this."""
        ws = self.workers.get(worker)
        return 0 if ws is None else ws.gpu_blocks

    def query(self, token_ids: Sequence[int], salt: Salt = None) -> dict[Hashable, TierHit]:
        """Tokens of `token_ids` (whole blocks) each worker can reuse under
        `salt` (a kvpool salt or `ReuseScope`: published as the workers'
        events publish it), per tier."""
        if not set(map(type, token_ids)) <= {int}:  # the check in C: a prompt is thousands of ids
            raise IndexUsageError("token_ids must be ints")
        root = scope_root(*published_scope(salt))
        bs = self.block_size
        keys: dict[int, list[int]] = {}  # per lookahead width: the workers' keys of the prompt
        out = {}
        for w, ws in self.workers.items():
            ahead = ws.ahead or 0
            if ahead not in keys:
                keys[ahead] = chain_keys(token_ids, bs, root, ahead)
            out[w] = TierHit(*(bs * self.longest(ws, keys[ahead], (2 << t) - 1) for t in range(len(TIERS))))
        return out

    def longest(self, ws: WorkerBlocks, keys: Sequence[int], mask: int) -> int:
        """Largest k <= len(keys) such that every group of `ws` holds what a
        hit of k blocks needs, in the tiers of `mask` (`cache/prefix.py`'s
        rule, per kind)."""
        groups = ws.groups or {0: GroupMeta("group0", "full", self.block_size)}
        k = len(keys)
        checks = []
        for gi, g in groups.items():
            if g.kind == "ignored":
                continue
            rule = g.rule
            if not rule.per_request and rule.stale_pages(g, NEVER) == 0:  # the leading run
                k = leading_run(ws, gi, keys, k, mask)
            else:
                checks.append((gi, g, rule))
        while k > 0 and not self.window_held(ws, keys, k, mask, checks):
            k -= 1
        return k

    def window_held(
        self, ws: WorkerBlocks, keys: Sequence[int], k: int, mask: int, checks: list[tuple[int, GroupMeta, KindRule]]
    ) -> bool:
        """Whether each group of `checks` holds, in the tiers of `mask`, the
        blocks its rule keeps for a hit of `k` blocks (the last one, or its window)."""
        for gi, g, rule in checks:
            first = k - 1 if rule.per_request else rule.stale_pages(g, k * self.block_size)
            if not all(ws.holds(gi, key, mask) for key in keys[first:k]):
                return False
        return True
