"""TensorRT-LLM KV cache manager V2: what V2 does with a byte quota, by its own
defaults (the allocator fallback) or given the executor's typical step and constraints.

Rules re-expressed from the core package `tensorrt_llm/runtime/kv_cache_manager_v2/`
(`_storage_manager.py`, `_storage/_core.py`, `_life_cycle_registry.py`) and the newest
C++ StorageManager (`cpp/tensorrt_llm/batch_manager/kv_cache_manager_v2/storageManager.cpp`),
as listed in tests/data/trtllm/README.md; no TensorRT-LLM code is used:

- Life cycles: layers with equal (window, sink tokens) share one; life cycles whose
  slot sizes are equal share one pool group (their slots are interchangeable).
- GPU tier granularity: `2 MiB << min(4, max(0, floor(log2(quota / 1 GiB))))`.
- Ratio per life cycle, each rounded *up to the granularity*: the typical step's slots,
  else the constraints' floors, else one request of capacity 2049, history 2048.
- Floors: `sink_blocks + (W + tpb - 2) // tpb + 1` per sliding life cycle, the largest of
  those for full attention, 1 for state; constraints raise them, scaled by
  `1 / max_util_for_resume`; floors that do not fit grow the quota past its budget.
- Slots: the quota (capped by `max_tokens`, rounded up to the granularity) is counted in
  grains and water-filled by `_water_fill` (`ratio_to_slot_count_list`); what a group's
  grains do not fill with whole slots is left unspent.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvpool.engines.common import EnginePool, EngineReport, Sizing
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


def round_up(value: int, step: int) -> int:
    """`value` rounded up to a multiple of `step`."""
    return -(-value // step) * step


Request = tuple[int, int]  # V2's KVCacheDesc: (capacity, history_length)
Batch = tuple[Request, ...]  # V2's BatchDesc (no shared system prompt)
FALLBACK_BATCH: Batch = ((FALLBACK_CAPACITY, FALLBACK_HISTORY),)
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


def life_cycle_floors(spec: ModelSpec, sinks: int = 0, window_extra: int = 0) -> dict[str, int]:
    """Structural floors per life cycle (`computeSlotsFromConstraints` with no constraint):
    1 for a state cycle, `sliding_floor` for a windowed one, and for full attention the
    largest windowed floor (every life cycle sees the same sequence), at least 1."""
    tpb = spec.tokens_per_block
    windowed = {
        g.name: sliding_floor(w, tpb, sinks)
        for g in spec.groups
        if g.kind != "state" and (w := life_cycle_window(g, window_extra)) is not None
    }
    full = max([1, *windowed.values()])
    return {g.name: 1 if g.kind == "state" else windowed.get(g.name, full) for g in spec.groups}


def check_pool_ratio(ratio: Sequence[float]) -> None:
    """StorageManager's checks on `initial_pool_ratio`: every share positive,
    summing to 1 within 1e-6."""
    if any(not r > 0 for r in ratio):
        raise LimitsError("pool_ratio values must be positive")
    if not math.isfinite(sum(ratio)) or abs(sum(ratio) - 1.0) > 1e-6:
        raise LimitsError("pool_ratio values must sum to 1.0")


@dataclass(frozen=True)
class V2Options:
    """What V2's sizing takes besides the quota (`KVCacheManagerConfig` / `KvCacheConfig`).

    `typical_step` and `constraints` are the batches the executor builds (see
    `executor_batches`); none of them gives the allocator fallback. `sink_tokens` is each
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
            check_pool_ratio(self.pool_ratio)
        if not 0.0 < self.max_util_for_resume <= 1.0:
            raise LimitsError(f"max_util_for_resume must be in (0, 1], got {self.max_util_for_resume}")
        if self.sink_tokens < 0 or self.window_extra < 0:
            raise LimitsError("sink_tokens and window_extra must not be negative")
        if self.max_tokens is not None and (self.max_tokens < 1 or self.max_num_tokens is None):
            raise LimitsError("max_tokens must be positive and needs max_num_tokens (V2's quota model)")


DEFAULTS = V2Options()


def executor_batches(
    *,
    max_batch_size: int,
    max_seq_len: int,
    max_num_tokens: int | None = None,
    max_draft_len: int = 0,
    num_extra_kv_tokens: int = 0,
    avg_seq_len: int | None = None,
    pool_ratio: bool = False,
) -> tuple[Batch | None, tuple[Batch, ...]]:
    """The typical step and constraints the generic `KVCacheManagerV2._build_base_config`
    gives the core manager (B, L, N, d, E, S as TensorRT-LLM names them):

    - no `avg_seq_len` (the default) or a `pool_ratio`: none (the allocator fallback);
    - typical step `[(N or S) + E, 0]` then `(B - 1) x [S, max(0, S - d - 1)]`;
    - constraints `[L, L - 1] + (B - 1) x [1 + d + E, 0]` (CUDA-graph warmup) and
      `[N + E, 0]` when N is set (one chunk of context).
    """
    if pool_ratio or avg_seq_len is None:
        return None, ()
    s, n, e = avg_seq_len, max_num_tokens, num_extra_kv_tokens
    if s > max_seq_len:
        raise LimitsError(f"avg_seq_len ({s}) must be less than or equal to max_seq_len ({max_seq_len})")
    decode = (s, max(0, s - max_draft_len - 1))
    typical = ((n if n is not None else s) + e, 0), *[decode] * (max_batch_size - 1)
    warmup = ((max_seq_len, max_seq_len - 1), *[(1 + max_draft_len + e, 0)] * (max_batch_size - 1))
    constraints = (warmup,) if n is None else (warmup, ((n + e, 0),))
    return typical, constraints


def deepseek_v4_batches(
    *,
    max_batch_size: int,
    max_seq_len: int,
    max_num_tokens: int | None = None,
    max_draft_len: int = 0,
    avg_seq_len: int | None = None,
) -> tuple[Batch, tuple[Batch, ...]]:
    """DeepSeek-V4's cache manager always builds them (S = avg_seq_len or L): typical step
    `[N or S, 0]` then `(B - 1) x [S, max(0, S - d - 1)]`; constraints `[L, L - 1]` and
    `[N, 0]` when N is set."""
    s = max_seq_len if avg_seq_len is None else avg_seq_len
    if s > max_seq_len:
        raise LimitsError(f"avg_seq_len ({s}) must be less than or equal to max_seq_len ({max_seq_len})")
    n = max_num_tokens
    typical = ((n if n is not None else s, 0), *[(s, max(0, s - max_draft_len - 1))] * (max_batch_size - 1))
    longest: Batch = ((max_seq_len, max_seq_len - 1),)
    return typical, ((longest,) if n is None else (longest, ((n, 0),)))


def options_for(
    limits: ServingLimits, *, avg_seq_len: int | None = None, max_tokens: int | None = None, sink_tokens: int = 0
) -> V2Options:
    """V2's options for a deployment whose `KvCacheConfig` sets `avg_seq_len` (and
    `max_tokens`, `sink_token_length`): the executor's typical step and constraints
    from B, L, N, d and E of `limits`."""
    typical, constraints = executor_batches(
        max_batch_size=limits.max_batch_size,
        max_seq_len=limits.max_seq_len,
        max_num_tokens=limits.max_num_tokens,
        max_draft_len=limits.max_draft_len,
        num_extra_kv_tokens=limits.num_extra_kv_tokens,
        avg_seq_len=avg_seq_len,
    )
    return V2Options(
        typical_step=typical,
        constraints=constraints,
        sink_tokens=sink_tokens,
        max_tokens=max_tokens,
        max_num_tokens=limits.max_num_tokens if max_tokens is not None else None,
        max_batch_size=limits.max_batch_size,
    )


DSV4_SPARSE_RATIO = 4  # the overlapping compressor keeps 2 x ratio tokens of state


def deepseek_v4_window(role: str, compress_ratio: int, swa_window: int, max_draft_len: int) -> int | None:
    """The window DeepSeek-V4's cache manager gives a role (`_get_window_size`): the SWA
    cache `W + d`, a compressor's state `state_factor x ratio + d` (state_factor 2 for the
    overlapping ratio-4 compressor, else 1), the compressed cache itself none (full)."""
    if role == "swa":
        return swa_window + max_draft_len
    if role == "compressor":
        return (2 if compress_ratio == DSV4_SPARSE_RATIO else 1) * compress_ratio + max_draft_len
    if role == "compress":
        return None
    raise LimitsError(f"unknown DeepSeek-V4 cache role {role!r}; roles: swa, compressor, compress")


def _widened(g: LayerGroup, extra: int) -> LayerGroup:
    """`g` at V2's own window: DeepSeek-V4 widens a sliding window by the draft length."""
    return replace(g, window=life_cycle_window(g, extra)) if extra and g.kind == "sliding" else g


def _row_bytes_by_window(spec: ModelSpec) -> tuple[int, list[tuple[int, int]]]:
    """Bytes per token of the full-attention groups, and (window, bytes per token)
    of each windowed one; state groups are neither."""
    attention = [(life_cycle_window(g), g.row_bytes) for g in spec.groups if g.kind != "state"]
    return sum(size for w, size in attention if w is None), [(w, size) for w, size in attention if w]


def quota_from_max_tokens(spec: ModelSpec, options: V2Options) -> int:
    """The generic manager's `_get_quota_from_max_tokens(T)`: `T x full + B x sum_swa
    (ceil(W / tpb) x tpb x size) + min(T, N) x sum_swa(size)` (sizes in bytes per token;
    a sliding layer costs its window per generating request and one row per context token);
    with state (Mamba) layers, the hybrid Mamba manager's override adds its state slots:
    `(B + reserved dummy slots) x state bytes per slot` (one per resident request and per
    padding dummy; prefix-cache snapshot slots are not modelled)."""
    assert options.max_tokens is not None and options.max_num_tokens is not None
    tpb, t = spec.tokens_per_block, options.max_tokens
    full, swa = _row_bytes_by_window(spec)
    per_request = sum(-(-w // tpb) * tpb * size for w, size in swa)
    attention = (
        t * full + options.max_batch_size * per_request + min(t, options.max_num_tokens) * sum(s for _, s in swa)
    )
    state = sum(g.state_bytes for g in spec.groups if g.kind == "state")
    return attention + (options.max_batch_size + RESERVED_DUMMY_SLOTS) * state


@dataclass(frozen=True)
class V2Sizing:
    """V2's sizing of one quota: granularity, grains and the pool groups."""

    quota_bytes: int
    granularity: int
    grains: int
    pool_groups: tuple[tuple[tuple[str, ...], int, int, int, int], ...]  # (groups, slot, floor, grains, slots)
    inflated: bool  # the floors did not fit and V2 grew the quota past it
    ratio_from: str = "fallback"  # typical step, constraints or the allocator fallback
    capped_by_max_tokens: bool = False

    @property
    def leftover_bytes(self) -> int:
        """Bytes of the (rounded) quota that hold no slot."""
        return self.grains * self.granularity - sum(slot * n for _, slot, _, _, n in self.pool_groups)


def _fill_round(budget: int, gran: int, active: list[int], ratio: dict[int, float]) -> dict[int, int]:
    """One round of `_water_fill`: the active groups by ratio, smallest first, each
    `round(budget * its share of the ratios still to serve)` grains filled with slots."""
    got: dict[int, int] = {}
    order = sorted(active, key=lambda k: ratio[k])
    for i, k in enumerate(order):
        rest = sum(ratio[j] for j in order[i:])
        share = ratio[k] / rest if rest else 0.0  # a batch may need no slot in a group
        got[k] = round(budget * share) * gran // k
        budget -= -(-got[k] * k // gran)
    return got


def _water_fill(
    total: int, gran: int, keys: list[int], ratio: dict[int, float], floors: dict[int, int]
) -> dict[int, int]:
    """Slots per pool group (keyed by slot bytes), as `_storage/_core.py`
    `CacheLevelStorage.ratio_to_slot_count_list` and its C++ twin (`storage/core.cpp`
    `ratioToSlotCountList`) do, for pool groups of one pool each: each round walks the active groups by ratio, smallest first, giving each
    `round(budget * its share of the ratios still to serve)` grains, filling them with slots
    and passing the grains those slots do not use on; groups at or below their floor are
    pinned to the floor's grains and the rest go round again."""
    out: dict[int, int] = {}
    remaining = total
    active = list(keys)
    while active:
        if remaining <= 0:
            raise LimitsError("insufficient quota to satisfy the pool groups' min slots")
        got = _fill_round(remaining, gran, active, ratio)
        low = [k for k in active if got[k] <= floors[k]]
        if not low:
            out.update(got)
            break
        for k in low:
            out[k] = -(-floors[k] * k // gran) * gran // k
            remaining -= -(-out[k] * k // gran)
        active = [k for k in active if k not in low]
    return out


def size(spec: ModelSpec, quota_bytes: int, options: V2Options = DEFAULTS) -> V2Sizing:
    """V2's pool groups and slot counts for `quota_bytes` of GPU memory, as the newest
    C++ `StorageManager` sizes them (`cpp/.../kv_cache_manager_v2/storageManager.cpp`):

    - floors per pool group: its life cycles' structural floors summed, raised to every
      constraint's slots divided by `max_util_for_resume` (a float; only for pool groups
      that can grow, i.e. hold a non-state life cycle: resume refuses above it);
    - ratio per life cycle, each life cycle's bytes rounded up to the granularity: from the
      typical step, else from the constraints' floors, else from the fallback request;
      a pool group's ratio is the sum of its life cycles';
    - quota: `max_tokens` caps it at `ceil(quota_from_max_tokens / max_util_for_resume)`;
      it is rounded up to the granularity and grown to the floors' bytes when they do not fit.

    A `pool_ratio` (`initial_pool_ratio`) replaces the ratio; the executor then passes
    no typical step and no constraints (`executor_batches(pool_ratio=True)`).
    """
    tpb = spec.tokens_per_block
    o = options
    capped = False
    if o.max_tokens is not None:
        cap = math.ceil(quota_from_max_tokens(spec, o) / o.max_util_for_resume)
        capped = cap < quota_bytes
        quota_bytes = min(quota_bytes, cap)
    gran = granularity(quota_bytes)
    merged: dict[int, list[LayerGroup]] = {}
    for g in spec.groups:
        merged.setdefault(g.slot_bytes, []).append(g)
    keys = list(merged)
    lc_floor = life_cycle_floors(spec, o.sink_tokens, o.window_extra)
    util = float32(o.max_util_for_resume)

    def need(g: LayerGroup, batch: Batch) -> int:
        return batch_slots(g, batch, tpb, o.sink_tokens, o.window_extra)

    def limit(k: int) -> float:  # `poolGroupNeedsHeadroomForGrowth`: any life cycle that grows
        return util if any(g.kind != "state" for g in merged[k]) else 1.0

    floors = {k: sum(lc_floor[g.name] for g in merged[k]) for k in keys}
    for batch in o.constraints:
        for k in keys:
            floors[k] = max(floors[k], math.ceil(sum(need(g, batch) for g in merged[k]) / limit(k)))
    lc_weight: dict[str, float] | None = None
    if o.pool_ratio is not None:
        if len(o.pool_ratio) != len(spec.groups):
            raise LimitsError(f"pool_ratio has {len(o.pool_ratio)} shares for {len(spec.groups)} life cycles")
        ratio_from, lc_weight = "pool_ratio", {g.name: r for g, r in zip(spec.groups, o.pool_ratio, strict=True)}
        lc_slots = {}
    elif o.typical_step is not None:
        ratio_from, lc_slots = "typical step", {g.name: need(g, o.typical_step) for g in spec.groups}
    elif o.constraints:
        ratio_from, lc_slots = "constraints", dict(lc_floor)
        for batch in o.constraints:
            for k in keys:
                for g in merged[k]:
                    lc_slots[g.name] = max(lc_slots[g.name], math.ceil(need(g, batch) / limit(k)))
    else:
        ratio_from, lc_slots = "fallback", {g.name: need(g, FALLBACK_BATCH) for g in spec.groups}
    if lc_weight is None:
        lc_weight = {g.name: round_up(lc_slots[g.name] * g.slot_bytes, gran) for g in spec.groups}
    total_weight = sum(lc_weight.values())
    if total_weight == 0:
        raise LimitsError("V2's ratio batch needs no slot in any life cycle")
    # the C++ StorageManager holds ratios as floats (float32)
    ratio = {k: float32(sum(lc_weight[g.name] for g in merged[k]) / total_weight) for k in keys}
    floor_grains = {k: -(-floors[k] * k // gran) for k in keys}
    total = round_up(quota_bytes, gran) // gran
    inflated = sum(floor_grains.values()) > total
    total = max(total, sum(floor_grains.values()))
    slots = _water_fill(total, gran, keys, ratio, floors)
    grains = {k: -(-slots[k] * k // gran) for k in keys}
    rows = tuple((tuple(g.name for g in merged[k]), k, floors[k], grains[k], grains[k] * gran // k) for k in keys)
    return V2Sizing(quota_bytes, gran, total, rows, inflated, ratio_from, capped)


@dataclass(frozen=True)
class V2EngineSizing(Sizing):
    """`Sizing` of the EngineModel protocol carrying V2's own numbers."""

    v2: V2Sizing | None = None


@dataclass(frozen=True)
class V2Model:
    """TensorRT-LLM KV cache manager V2 (by its defaults unless `options` say
    otherwise), as an `EngineModel`."""

    version: str
    base_sources: tuple[str, ...]
    engine: str = "trtllm"
    release: str = "v2"
    options: V2Options = DEFAULTS

    @property
    def sources(self) -> tuple[str, ...]:
        return (*self.base_sources, SOURCE)

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> V2EngineSizing:
        v2 = size(spec, kv_memory_bytes, self.options)
        degradations = (
            ("the pool groups' floors do not fit: V2 grows the quota past the budget",) if v2.inflated else ()
        )
        source = (
            f"one request of capacity {FALLBACK_CAPACITY}, history {FALLBACK_HISTORY} (allocator fallback)"
            if v2.ratio_from == "fallback"
            else f"the {v2.ratio_from}"
        )
        notes = (
            f"V2: ratio from {source}, each life cycle rounded up to the {v2.granularity // MiB} MiB "
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
        return V2EngineSizing(spec, limits, kv_memory_bytes, (), degradations, notes, v2)

    def pools(self, sizing: V2EngineSizing) -> tuple[EnginePool, ...]:
        assert sizing.v2 is not None
        tpb = sizing.spec.tokens_per_block
        by_name = {g.name: g for g in sizing.spec.groups}
        out = []
        extra = self.options.window_extra
        for names, slot, _, _, slots in sizing.v2.pool_groups:
            members = tuple(_widened(by_name[n], extra) for n in names)
            paged = any(m.kind != "state" for m in members)
            tokens = slots * tpb if paged else None
            out.append(EnginePool("+".join(names), tpb if paged else 0, slot, slots, names, members, tokens))
        return tuple(out)

    def report(self, sizing: V2EngineSizing, pools: tuple[EnginePool, ...]) -> EngineReport:
        assert sizing.v2 is not None
        merged = any(len(p.groups) > 1 for p in pools)
        degradations = list(sizing.degradations)
        spent = sum(p.bytes for p in pools)
        if spent > sizing.budget_bytes:
            degradations.append(
                f"V2's pools take {spent:,} bytes, more than the {sizing.budget_bytes:,} budget "
                "(the quota is rounded up to the granularity)"
            )
        reported = {
            "slots_per_pool_group": {p.name: p.pages for p in pools},
            "granularity": sizing.v2.granularity,
            "grains": sizing.v2.grains,
            "tokens_per_block": sizing.spec.tokens_per_block,
        }
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
            None if merged else {p.groups[0]: p.pages for p in pools},
        )
