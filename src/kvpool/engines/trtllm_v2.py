"""TensorRT-LLM KV cache manager V2: what V2 does with a byte quota, by its own
defaults (the allocator fallback) or given the executor's typical step and constraints.

Rules re-expressed from the core package `tensorrt_llm/runtime/kv_cache_manager_v2/`
(`_storage_manager.py`, `_storage/_core.py`, `_life_cycle_registry.py`) and the newest
C++ StorageManager (`cpp/tensorrt_llm/batch_manager/kv_cache_manager_v2/storageManager.cpp`),
as listed in tests/data/trtllm/README.md; no TensorRT-LLM code is used:

- Life cycles: layers with equal (window, sink tokens) share one; within one, buffers of
  one size share a pool; life cycles whose pools are equal share one pool group (their
  slots are interchangeable): `trtllm_v2_storage`.
- GPU tier granularity: `2 MiB << min(4, max(0, floor(log2(quota / 1 GiB))))`.
- Ratio per life cycle, each pool rounded *up to the granularity*, in float32: the typical
  step's slots, else the constraints' floors, else one request of capacity 2049, history 2048.
- Floors: `sink_blocks + (W + tpb - 2) // tpb + 1` per sliding life cycle, the largest of
  those for full attention, 1 for state; constraints raise them, scaled by
  `1 / max_util_for_resume`; floors that do not fit grow the quota past its budget.
- Slots: the quota (capped by `max_tokens`, rounded up to the granularity) is counted in
  grains and water-filled (`trtllm_v2_storage.water_fill`, `ratioToSlotCountList`); what
  a group's grains do not fill with whole slots is left unspent.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvpool.engines import trtllm_v2_storage as storage
from kvpool.engines.common import EnginePool, EngineReport, Sizing
from kvpool.engines.trtllm_v2_storage import round_up
from kvpool.errors import LimitsError
from kvpool.plan.limits import ServingLimits
from kvpool.spec import LayerGroup, ModelSpec

MiB = 1 << 20
GiB = 1 << 30
FALLBACK_CAPACITY = 2049  # the allocator fallback's one request: capacity 2049, history 2048
FALLBACK_HISTORY = 2048
SOURCE = (
    "tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py and cpp/tensorrt_llm/batch_manager/"
    "kv_cache_manager_v2/storageManager.cpp: StorageManager (floors, ratio, water-filling)"
)


def granularity(quota_bytes: int) -> int:
    """V2's GPU tier granularity for a quota: 2 MiB below 2 GiB, doubling per doubling, 32 MiB from 16 GiB."""
    if quota_bytes < 1:
        raise LimitsError(f"quota must be positive, got {quota_bytes}")
    level = 0
    while level < 4 and quota_bytes >= (2 << level) * GiB:
        level += 1
    return (2 * MiB) << level


Request = tuple[int, int]  # V2's KVCacheDesc: (capacity, history_length)
Batch = tuple[Request, ...]  # V2's BatchDesc (no shared system prompt)
FALLBACK_BATCH: Batch = ((FALLBACK_CAPACITY, FALLBACK_HISTORY),)
INFLATED = "the pool groups' floors do not fit: V2 grows the quota past the budget"
MAX_UTIL_FOR_RESUME = 0.95  # KvCacheConfig's default (the core package's own default is 0.97)
RESERVED_DUMMY_SLOTS = 1  # num_reserved_index_slots: one CUDA-graph padding dummy


def float32(value: float) -> float:
    """`value` as the C++ StorageManager holds it (its max_util_for_resume is a float)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def life_cycle_window(group: LayerGroup, extra: int = 0) -> int | None:
    """The window V2 gives a group's life cycle: None for full attention, else the
    group's window plus `extra` (DeepSeek-V4 widens its windows by the draft length)."""
    if group.kind == "full" or group.window is None:
        return None
    return group.window + extra


def life_cycle_blocks(
    group: LayerGroup, capacity: int, history: int, tpb: int, sinks: int = 0, window_extra: int = 0
) -> int:
    """Slots one request of (capacity, history) holds in a life cycle, as
    `computeSlotsForBatch` counts them: one for a state cycle, else `ceil(capacity / tpb)`
    less the stale blocks `[min(ceil(h / tpb), sink_blocks), floor((h + 1 - W) / tpb))`
    (the +1 is the token in flight)."""
    if group.kind == "state":
        return 1
    blocks = -(-capacity // tpb)
    window = life_cycle_window(group, window_extra)
    if window is None:
        return blocks
    start = min(-(-history // tpb), -(-sinks // tpb))
    end = (history + 1 - window) // tpb
    return blocks - max(0, end - start)


def batch_slots(group: LayerGroup, batch: Batch, tpb: int, sinks: int = 0, window_extra: int = 0) -> int:
    """Slots a whole batch holds in one life cycle (its requests' slots summed)."""
    return sum(life_cycle_blocks(group, c, h, tpb, sinks, window_extra) for c, h in batch)


def sliding_floor(window: int, tpb: int, sinks: int = 0) -> int:
    """The newest StorageManager's floor for a sliding life cycle:
    `sink_blocks + (W + tpb - 2) // tpb + 1` (the window's slots as it slides, plus one)."""
    return -(-sinks // tpb) + (window + tpb - 2) // tpb + 1


def cycle_floors(cycles: tuple[storage.LifeCycle, ...], tpb: int, sinks: int = 0, window_extra: int = 0) -> list[int]:
    """Structural floors per life cycle (`computeSlotsFromConstraints` with no constraint):
    1 for a state cycle, `sliding_floor` for a windowed one, and for full attention the
    largest windowed floor (every life cycle sees the same sequence), at least 1."""
    windows = [None if lc.group.kind == "state" else life_cycle_window(lc.group, window_extra) for lc in cycles]
    windowed = [sliding_floor(w, tpb, sinks) for w in windows if w is not None]
    full = max([1, *windowed])
    return [
        1 if lc.group.kind == "state" else full if w is None else sliding_floor(w, tpb, sinks)
        for lc, w in zip(cycles, windows, strict=True)
    ]


def life_cycle_floors(spec: ModelSpec, sinks: int = 0, window_extra: int = 0) -> dict[str, int]:
    """`cycle_floors` by the name of each of the spec's groups (its life cycle's floor)."""
    cycles = storage.life_cycles(spec)
    floors = cycle_floors(cycles, spec.tokens_per_block, sinks, window_extra)
    return {name: f for lc, f in zip(cycles, floors, strict=True) for name in lc.names}


@dataclass(frozen=True)
class V2Options:
    """What V2's sizing takes besides the quota (`KVCacheManagerConfig` / `KvCacheConfig`).

    `typical_step` and `constraints` are the batches the executor builds (see
    `trtllm_v2_executor.executor_batches`); none of them gives the allocator fallback. `sink_tokens` is each
    layer's `num_sink_tokens`, `window_extra` what DeepSeek-V4 adds to every window (its
    draft length), `max_tokens` the KvCacheConfig cap with `max_num_tokens` (N) and
    `max_batch_size` (B) its quota model needs.
    """

    typical_step: Batch | None = None
    constraints: tuple[Batch, ...] = ()
    max_util_for_resume: float = MAX_UTIL_FOR_RESUME
    sink_tokens: int = 0
    window_extra: int = 0
    max_tokens: int | None = None
    max_num_tokens: int | None = None
    max_batch_size: int = 1
    pool_ratio: tuple[float, ...] | None = None  # one share per life cycle (group), in spec order

    def __post_init__(self) -> None:
        if self.pool_ratio is not None:
            # StorageManager's checks on initial_pool_ratio: every share positive, summing to 1 within 1e-6
            if any(not r > 0 for r in self.pool_ratio):
                raise LimitsError("pool_ratio values must be positive")
            if not math.isfinite(sum(self.pool_ratio)) or abs(sum(self.pool_ratio) - 1.0) > 1e-6:
                raise LimitsError("pool_ratio values must sum to 1.0")
        if not 0.0 < self.max_util_for_resume <= 1.0:
            raise LimitsError(f"max_util_for_resume must be in (0, 1], got {self.max_util_for_resume}")
        if self.sink_tokens < 0 or self.window_extra < 0:
            raise LimitsError("sink_tokens and window_extra must not be negative")
        if self.max_tokens is not None and (self.max_tokens < 1 or self.max_num_tokens is None):
            raise LimitsError("max_tokens must be positive and needs max_num_tokens (V2's quota model)")


DEFAULTS = V2Options()


def quota_from_max_tokens(spec: ModelSpec, options: V2Options) -> int:
    """The generic manager's `_get_quota_from_max_tokens(T)`: `T x full + B x sum_swa
    (ceil(W / tpb) x tpb x size) + min(T, N) x sum_swa(size)` (sizes in bytes per token;
    a sliding layer costs its window per generating request and one row per context token);
    with state (Mamba) layers, the hybrid Mamba manager's override adds its state slots:
    `(B + reserved dummy slots) x state bytes per slot` (one per resident request and per
    padding dummy; prefix-cache snapshot slots are not modelled)."""
    assert options.max_tokens is not None and options.max_num_tokens is not None
    tpb, t = spec.tokens_per_block, options.max_tokens
    full = sum(g.row_bytes for g in spec.groups if g.kind != "state" and life_cycle_window(g) is None)
    swa = [(w, g.row_bytes) for g in spec.groups if g.kind != "state" and (w := life_cycle_window(g))]
    per_request = sum(-(-w // tpb) * tpb * size for w, size in swa)
    attention = (
        t * full + options.max_batch_size * per_request + min(t, options.max_num_tokens) * sum(s for _, s in swa)
    )
    state = sum(g.state_bytes for g in spec.groups if g.kind == "state")
    return attention + (options.max_batch_size + RESERVED_DUMMY_SLOTS) * state


def cache_cost(spec: ModelSpec, max_batch_size: int) -> tuple[int, int]:
    """What one V2 manager costs, as `KVCacheManagerV2.get_cache_size_per_token` states
    it to the executor: (bytes per token, fixed bytes) = (the full-attention rows, `B x
    sum_swa(ceil(W / tpb) x tpb x size)` plus, with state layers, `(B + reserved dummy
    slots) x` the state bytes)."""
    tpb = spec.tokens_per_block
    full = sum(g.row_bytes for g in spec.groups if g.kind != "state" and life_cycle_window(g) is None)
    swa = sum(
        -(-w // tpb) * tpb * g.row_bytes for g in spec.groups if g.kind != "state" and (w := life_cycle_window(g))
    )
    state = sum(g.state_bytes for g in spec.groups if g.kind == "state")
    return full, max_batch_size * swa + (max_batch_size + RESERVED_DUMMY_SLOTS) * state


def split_draft_budget(total: int, target: tuple[int, int], draft: tuple[int, int]) -> tuple[int, int]:
    """(target, draft) bytes of a budget shared with a one-model drafter's separate KV cache
    manager (`KvCacheCreator._compute_draft_budget_shares`): each keeps its fixed bytes and
    the rest is split by bytes per token, the drafter's share truncated to whole bytes. A
    side with no bytes per token is not split (`_get_target_and_draft_cache_costs` gives
    none): each manager then takes the whole budget."""
    if target[0] <= 0 or draft[0] <= 0:
        return total, total
    rest = total - target[1] - draft[1]
    if rest <= 0:
        raise LimitsError(
            f"the KV budget ({total:,} bytes) does not hold the target's and drafter's fixed bytes "
            f"({target[1] + draft[1]:,}); TensorRT-LLM V2 refuses the split: give more KV memory or a smaller batch"
        )
    share = draft[1] + int(rest * draft[0] / (target[0] + draft[0]))
    return total - share, share


@dataclass(frozen=True)
class V2Sizing:
    """V2's sizing of one quota: granularity, grains and the pool groups, each
    `(groups, slot bytes, floor, grains, slots)`, with its pools' bytes per slot in `pools`."""

    quota_bytes: int
    granularity: int
    grains: int
    pool_groups: tuple[tuple[tuple[str, ...], int, int, int, int], ...]  # (groups, slot, floor, grains, slots)
    inflated: bool  # the floors did not fit and V2 grew the quota past it
    ratio_from: str = "fallback"  # typical step, constraints or the allocator fallback
    capped_by_max_tokens: bool = False
    pools: tuple[tuple[int, ...], ...] = ()  # per pool group: one pool per buffer size, largest first

    @property
    def leftover_bytes(self) -> int:
        """Bytes of the (rounded) quota that hold no slot."""
        return self.grains * self.granularity - sum(slot * n for _, slot, _, _, n in self.pool_groups)


def size(spec: ModelSpec, quota_bytes: int, options: V2Options = DEFAULTS) -> V2Sizing:
    """V2's pool groups and slot counts for `quota_bytes` of GPU memory, as the newest
    C++ `StorageManager` sizes them (`cpp/.../kv_cache_manager_v2/storageManager.cpp`;
    life cycles, pools and float32 ratios in `trtllm_v2_storage`):

    - floors per pool group: its life cycles' structural floors summed, raised to every
      constraint's slots divided by `max_util_for_resume` (a float; only for pool groups
      that can grow, i.e. hold a non-state life cycle: resume refuses above it);
    - ratio per life cycle, each pool's bytes rounded up to the granularity: from the
      typical step, else from the constraints' floors, else from the fallback request;
      float32 shares summed per pool group in float32 and normalised again;
    - quota: `max_tokens` caps it at `ceil(quota_from_max_tokens / max_util_for_resume)`;
      it is rounded up to the granularity and grown to the floors' bytes when they do not fit.

    A `pool_ratio` (`initial_pool_ratio`, one share per life cycle) replaces the ratio; the
    executor then passes no typical step and no constraints (`trtllm_v2_executor.executor_batches(pool_ratio=True)`).
    """
    tpb = spec.tokens_per_block
    o = options
    capped = False
    if o.max_tokens is not None:
        cap = math.ceil(quota_from_max_tokens(spec, o) / o.max_util_for_resume)
        capped = cap < quota_bytes
        quota_bytes = min(quota_bytes, cap)
    gran = granularity(quota_bytes)
    cycles = storage.life_cycles(spec)
    merged = storage.pool_groups(cycles)
    sizes = list(merged)
    pg_of = [sizes.index(lc.pools) for lc in cycles]
    lc_floor = cycle_floors(cycles, tpb, o.sink_tokens, o.window_extra)
    util = float32(o.max_util_for_resume)

    def need(lc: storage.LifeCycle, batch: Batch) -> int:
        return batch_slots(lc.group, batch, tpb, o.sink_tokens, o.window_extra)

    def limit(pg: int) -> float:  # `poolGroupNeedsHeadroomForGrowth`: any life cycle that grows
        return util if any(lc.group.kind != "state" for lc in merged[sizes[pg]]) else 1.0

    floors = [0] * len(sizes)
    for i in range(len(cycles)):
        floors[pg_of[i]] += lc_floor[i]
    for batch in o.constraints:
        for pg, s in enumerate(sizes):
            floors[pg] = max(floors[pg], math.ceil(sum(need(lc, batch) for lc in merged[s]) / limit(pg)))
    if o.pool_ratio is not None:
        if len(o.pool_ratio) != len(cycles):
            names = ", ".join("+".join(lc.names) for lc in cycles)
            raise LimitsError(f"pool_ratio has {len(o.pool_ratio)} shares for {len(cycles)} life cycles ({names})")
        ratio_from, lc_ratio = "pool_ratio", [np.float32(r) for r in o.pool_ratio]
    else:
        if o.typical_step is not None:
            ratio_from, lc_slots = "typical step", [need(lc, o.typical_step) for lc in cycles]
        elif o.constraints:
            ratio_from, lc_slots = "constraints", list(lc_floor)
            for batch in o.constraints:
                for i, lc in enumerate(cycles):
                    lc_slots[i] = max(lc_slots[i], math.ceil(need(lc, batch) / limit(pg_of[i])))
        else:
            ratio_from, lc_slots = "fallback", [need(lc, FALLBACK_BATCH) for lc in cycles]
        lc_ratio = storage.normalize(
            [storage.slot_bytes(n, lc.pools, gran) for n, lc in zip(lc_slots, cycles, strict=True)]
        )
    ratio = storage.pool_group_ratio(lc_ratio, pg_of, len(sizes))
    floor_grains = sum(storage.grains_for_slots(f, s, gran) for f, s in zip(floors, sizes, strict=True))
    total = round_up(quota_bytes, gran) // gran
    inflated = floor_grains > total
    total = max(total, floor_grains)
    slots = storage.water_fill(total, gran, sizes, ratio, floors)
    rows = tuple(
        (
            tuple(n for lc in merged[s] for n in lc.names),
            sum(s),
            floors[pg],
            storage.grains_for_slots(slots[pg], s, gran),
            slots[pg],
        )
        for pg, s in enumerate(sizes)
    )
    return V2Sizing(quota_bytes, gran, total, rows, inflated, ratio_from, capped, tuple(sizes))


@dataclass(frozen=True)
class V2EngineSizing(Sizing):
    """`Sizing` of the EngineModel protocol carrying V2's own numbers: the target's
    manager (`v2`) and, with a drafter, the separate draft manager's (`draft`) with the
    byte budgets the two were given."""

    v2: V2Sizing | None = None
    draft: V2Sizing | None = None
    budgets: tuple[int, ...] = ()  # (target, draft) bytes when a drafter splits the budget


def _sizing_notes(spec: ModelSpec, v2: V2Sizing, who: str = "V2") -> tuple[str, ...]:
    source = (
        f"one request of capacity {FALLBACK_CAPACITY}, history {FALLBACK_HISTORY} (allocator fallback)"
        if v2.ratio_from == "fallback"
        else f"the {v2.ratio_from}"
    )
    return (
        f"{who}: ratio from {source}, each pool rounded up to the {v2.granularity // MiB} MiB "
        f"granularity; {v2.grains} grains; {v2.leftover_bytes:,} bytes hold no slot",
        *((f"max_tokens caps the quota at {v2.quota_bytes:,} bytes",) if v2.capped_by_max_tokens else ()),
        *(
            (
                "TensorRT-LLM's hybrid Mamba manager gives V2 its own typical step (avg_seq_len, else "
                "max_seq_len / 2 per resident sequence) and a state floor: not modelled, so these state "
                "slots are the core manager's",
            )
            if any(g.kind == "state" for g in spec.groups) and v2.ratio_from == "fallback"
            else ()
        ),
    )


@dataclass(frozen=True)
class V2Model:
    """TensorRT-LLM KV cache manager V2 (by its defaults unless `options` say
    otherwise), as an `EngineModel`. A spec with a drafter's groups gets the one-model
    separate draft manager: the budget split by `split_draft_budget`, each manager sized
    on its share."""

    version: str
    base_sources: tuple[str, ...]
    engine: str = "trtllm"
    release: str = "v2"
    options: V2Options = DEFAULTS

    @property
    def sources(self) -> tuple[str, ...]:
        return (*self.base_sources, SOURCE)

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> V2EngineSizing:
        if not spec.draft_groups:
            v2 = size(spec, kv_memory_bytes, self.options)
            degradations = (INFLATED,) if v2.inflated else ()
            return V2EngineSizing(spec, limits, kv_memory_bytes, (), degradations, _sizing_notes(spec, v2), v2)
        target = replace(spec, groups=spec.target_groups, drafter=None)
        drafter = replace(spec, groups=spec.draft_groups, drafter=None)
        windows = {life_cycle_window(g) for g in drafter.groups if g.kind != "state"}
        if len(windows) > 1 or any(g.kind == "state" for g in drafter.groups):
            refusal = (
                "a drafter with several attention life cycles (windows "
                f"{sorted(str(w) for w in windows)}) or state layers: TensorRT-LLM's separate draft KV cache "
                "manager refuses a VSWA draft (_create_one_model_draft_kv_cache_manager)"
            )
            v2 = size(target, kv_memory_bytes, self.options)
            return V2EngineSizing(spec, limits, kv_memory_bytes, (refusal,), (), _sizing_notes(target, v2), v2)
        b = limits.max_batch_size
        budgets = split_draft_budget(kv_memory_bytes, cache_cost(target, b), cache_cost(drafter, b))
        # the draft manager's config is a copy of the target's; a pool_ratio becomes [1.0] (one life cycle)
        draft_options = replace(self.options, pool_ratio=(1.0,)) if self.options.pool_ratio else self.options
        v2 = size(target, budgets[0], self.options)
        vd = size(drafter, budgets[1], draft_options)
        degradations = (INFLATED,) if v2.inflated or vd.inflated else ()
        split = (
            f"V2's separate draft manager: the {kv_memory_bytes:,} bytes split by bytes per token (target "
            f"{budgets[0]:,}, drafter {budgets[1]:,}; _compute_draft_budget_shares)"
            if budgets[0] + budgets[1] == kv_memory_bytes
            else "V2's separate draft manager: a drafter or target with no full-attention bytes per token is not "
            "split (_get_target_and_draft_cache_costs): each manager takes the whole budget"
        )
        notes = (split, *_sizing_notes(target, v2), *_sizing_notes(drafter, vd, "V2 drafter"))
        return V2EngineSizing(spec, limits, kv_memory_bytes, (), degradations, notes, v2, vd, budgets)

    def pools(self, sizing: V2EngineSizing) -> tuple[EnginePool, ...]:
        assert sizing.v2 is not None
        return self._pools(sizing.spec, sizing.v2) + (self._pools(sizing.spec, sizing.draft) if sizing.draft else ())

    def _pools(self, spec: ModelSpec, v2: V2Sizing) -> tuple[EnginePool, ...]:
        tpb = spec.tokens_per_block
        by_name = {g.name: g for g in spec.groups}
        cycles = storage.life_cycles(spec, tuple(by_name[n] for names, *_ in v2.pool_groups for n in names))
        out = []
        extra = self.options.window_extra
        for names, slot, _, _, slots in v2.pool_groups:
            # one member per life cycle (a slot holds every group of it), at V2's own windows
            # (DeepSeek-V4 widens them by the draft length)
            members = tuple(
                replace(g, window=life_cycle_window(g, extra)) if extra and g.kind == "sliding" else g
                for g in (lc.group for lc in cycles if lc.names[0] in names)
            )
            paged = any(m.kind != "state" for m in members)
            tokens = slots * tpb if paged else None
            out.append(EnginePool("+".join(names), tpb if paged else 0, slot, slots, names, members, tokens))
        return tuple(out)

    def report(self, sizing: V2EngineSizing, pools: tuple[EnginePool, ...]) -> EngineReport:
        assert sizing.v2 is not None
        shared = any(len(p.members) > 1 for p in pools)  # life cycles sharing slots
        degradations = list(sizing.degradations)
        spent = sum(p.bytes for p in pools)
        if spent > sizing.budget_bytes:
            degradations.append(
                f"V2's pools take {spent:,} bytes, more than the {sizing.budget_bytes:,} budget "
                "(the quota is rounded up to the granularity)"
            )
        reported: dict[str, Any] = {
            "slots_per_pool_group": {p.name: p.pages for p in pools},
            "granularity": sizing.v2.granularity,
            "grains": sizing.v2.grains,
            "tokens_per_block": sizing.spec.tokens_per_block,
        }
        if sizing.draft is not None:
            reported |= {"draft_granularity": sizing.draft.granularity, "draft_grains": sizing.draft.grains}
            reported |= {"target_budget_bytes": sizing.budgets[0], "draft_budget_bytes": sizing.budgets[1]}
        return EngineReport(
            self.engine,
            self.version
            + ", KV cache manager V2"
            + (" (allocator fallback)" if sizing.v2.ratio_from == "fallback" else f" ({sizing.v2.ratio_from})"),
            self.sources,
            sizing.limits,
            sizing.budget_bytes,
            pools,
            reported,
            tuple(f"[{p.name}] {p.pages} slots of {p.page_bytes} bytes" for p in pools),
            sizing.refusals,
            tuple(degradations),
            sizing.notes,
            None if shared else {name: p.pages for p in pools for name in p.groups},
        )
