"""TensorRT-LLM KV cache manager V2 sized by its own defaults: what V2 does with a
byte quota when no `pool_ratio`, `avg_seq_len` or constraints are given.

Rules re-expressed from the core package `tensorrt_llm/runtime/kv_cache_manager_v2/`
(`_storage_manager.py` StorageManager, `_storage/_config.py`, `_life_cycle_registry.py`),
as digested in shared/research/trtllm-kvcm-v2.md; no TensorRT-LLM code is used:

- Life cycles: layers with equal (window, sink tokens) share one; life cycles whose
  slot sizes are equal share one pool group (their slots are interchangeable).
- GPU tier granularity: `2 MiB << min(4, max(0, floor(log2(quota / 1 GiB))))`.
- Ratio (allocator fallback): the bytes one request of capacity 2049, history 2048
  holds in each pool group, each rounded *up to the granularity* before the ratio.
- Slots: the quota (rounded up to the granularity) is counted in grains and water-filled
  by `_water_fill` (`_storage/_core.py` `ratio_to_slot_count_list`); what a group's grains
  do not fill with whole slots is left unspent.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.engines.common import EnginePool, EngineReport, Sizing
from kvpool.errors import LimitsError
from kvpool.plan.limits import ServingLimits
from kvpool.spec import LayerGroup, ModelSpec

MiB = 1 << 20
GiB = 1 << 30
FALLBACK_CAPACITY = 2049  # the allocator fallback's one request: capacity 2049, history 2048
FALLBACK_HISTORY = 2048
SOURCE = "tensorrt_llm/runtime/kv_cache_manager_v2/_storage_manager.py: StorageManager (ratio, water-filling)"


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


def life_cycle_blocks(group: LayerGroup, capacity: int, history: int, tpb: int, sinks: int = 0) -> int:
    """Slots one request of (capacity, history) holds in a life cycle: one for a state
    cycle, else `ceil(capacity / tpb)` less the stale blocks
    `[min(ceil(h / tpb), sink_blocks), floor((h + 1 - W) / tpb))` (the +1 is the token in flight)."""
    if group.kind == "state":
        return 1
    blocks = -(-capacity // tpb)
    if group.kind == "full" or group.window is None:
        return blocks
    start = min(-(-history // tpb), -(-sinks // tpb))
    end = (history + 1 - group.window) // tpb
    return blocks - max(0, end - start)


def sliding_floor(window: int, tpb: int) -> int:
    """The newest StorageManager's floor for a sliding life cycle: `(W + tpb - 2) // tpb + 1`."""
    return (window + tpb - 2) // tpb + 1


@dataclass(frozen=True)
class V2Sizing:
    """V2's sizing of one quota: granularity, grains and the pool groups."""

    quota_bytes: int
    granularity: int
    grains: int
    pool_groups: tuple[tuple[tuple[str, ...], int, int, int, int], ...]  # (groups, slot, floor, grains, slots)
    inflated: bool  # the floors did not fit and V2 grew the quota past it

    @property
    def leftover_bytes(self) -> int:
        """Bytes of the (rounded) quota that hold no slot."""
        return self.grains * self.granularity - sum(slot * n for _, slot, _, _, n in self.pool_groups)


def _water_fill(
    total: int, gran: int, keys: list[int], ratio: dict[int, float], floors: dict[int, int]
) -> dict[int, int]:
    """Slots per pool group (keyed by slot bytes), as `_storage/_core.py`
    `CacheLevelStorage.ratio_to_slot_count_list` does (read in NVIDIA/TensorRT-LLM's stored
    version): each round walks the active groups by ratio, smallest first, giving each
    `round(budget * its share of the ratios still to serve)` grains, filling them with slots
    and passing the grains those slots do not use on; groups at or below their floor are
    pinned to the floor's grains and the rest go round again."""
    out: dict[int, int] = {}
    remaining = total
    active = list(keys)
    while active:
        budget = remaining
        got: dict[int, int] = {}
        order = sorted(active, key=lambda k: ratio[k])
        for i, k in enumerate(order):
            share = ratio[k] / sum(ratio[j] for j in order[i:])
            got[k] = round(budget * share) * gran // k
            budget -= -(-got[k] * k // gran)
        low = [k for k in active if got[k] <= floors[k]]
        if not low:
            out.update(got)
            break
        for k in low:
            out[k] = -(-floors[k] * k // gran) * gran // k
            remaining -= -(-out[k] * k // gran)
        active = [k for k in active if k not in low]
    return out


def size(spec: ModelSpec, quota_bytes: int) -> V2Sizing:
    """V2's pool groups and slot counts for `quota_bytes` of GPU memory by its allocator fallback."""
    tpb = spec.tokens_per_block
    gran = granularity(quota_bytes)
    merged: dict[int, list[LayerGroup]] = {}
    for g in spec.groups:
        merged.setdefault(g.slot_bytes, []).append(g)
    keys = list(merged)
    demand = {
        k: round_up(sum(life_cycle_blocks(g, FALLBACK_CAPACITY, FALLBACK_HISTORY, tpb) for g in merged[k]) * k, gran)
        for k in keys
    }
    floors = {
        k: sum(sliding_floor(g.window, tpb) if g.kind == "sliding" and g.window else 1 for g in merged[k]) for k in keys
    }
    floor_grains = {k: -(-floors[k] * k // gran) for k in keys}
    total = round_up(quota_bytes, gran) // gran
    inflated = sum(floor_grains.values()) > total
    total = max(total, sum(floor_grains.values()))
    slots = _water_fill(total, gran, keys, {k: demand[k] / sum(demand.values()) for k in keys}, floors)
    grains = {k: -(-slots[k] * k // gran) for k in keys}
    rows = tuple((tuple(g.name for g in merged[k]), k, floors[k], grains[k], grains[k] * gran // k) for k in keys)
    return V2Sizing(quota_bytes, gran, total, rows, inflated)


@dataclass(frozen=True)
class V2EngineSizing(Sizing):
    """`Sizing` of the EngineModel protocol carrying V2's own numbers."""

    v2: V2Sizing | None = None


@dataclass(frozen=True)
class V2Model:
    """TensorRT-LLM KV cache manager V2 by its defaults, as an `EngineModel`."""

    version: str
    base_sources: tuple[str, ...]
    engine: str = "trtllm"
    release: str = "v2"

    @property
    def sources(self) -> tuple[str, ...]:
        return (*self.base_sources, SOURCE)

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> V2EngineSizing:
        v2 = size(spec, kv_memory_bytes)
        degradations = (
            ("the pool groups' floors do not fit: V2 grows the quota past the budget",) if v2.inflated else ()
        )
        notes = (
            f"V2 allocator fallback: ratio from one request of capacity {FALLBACK_CAPACITY}, history "
            f"{FALLBACK_HISTORY}, each pool group rounded up to the {v2.granularity // MiB} MiB granularity; "
            f"{v2.grains} grains; {v2.leftover_bytes:,} bytes hold no slot",
        )
        return V2EngineSizing(spec, limits, kv_memory_bytes, (), degradations, notes, v2)

    def pools(self, sizing: V2EngineSizing) -> tuple[EnginePool, ...]:
        assert sizing.v2 is not None
        tpb = sizing.spec.tokens_per_block
        by_name = {g.name: g for g in sizing.spec.groups}
        out = []
        for names, slot, _, _, slots in sizing.v2.pool_groups:
            members = tuple(by_name[n] for n in names)
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
            self.version + ", KV cache manager V2 (allocator fallback)",
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
