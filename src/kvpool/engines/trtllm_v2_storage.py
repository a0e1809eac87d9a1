"""TensorRT-LLM KV cache manager V2's storage: life cycles, pool groups of one pool per
buffer size, float32 ratios and the water-filling of grains.

Re-expressed (no TensorRT-LLM code used) from the core package's
`_storage/_config.py` (`create_storage_config`), `_storage/_core.py` and the C++
`storage/core.cpp` (`grainsToSlots`, `grainsForSlots`, `ratioToSlotCountList`) and
`storageManager.cpp` (`slotsToBytes`, `toPoolGroupRatio`, `normalizeToRatio`), as
tests/data/trtllm/README.md lists them:

- a life cycle is every layer of one window (None for full attention), or every
  state (SSM) layer; within it, buffers of one size coalesce into one pool, and its
  pools, largest first, are its slot size list;
- life cycles with equal slot size lists share one pool group (their slots are
  interchangeable); a slot of a pool group is one slot in each of its pools;
- bytes are counted per pool, each rounded up to the granularity (a grain);
- ratios are float32 (`std::vector<float>`): a life cycle's bytes over the total,
  summed per pool group in float32 and normalised again in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpool.errors import LimitsError
from kvpool.spec import LayerGroup, ModelSpec
from kvpool.spec.dtypes import row_bytes

Sizes = tuple[int, ...]  # one pool group's pools, bytes per slot, largest first


@dataclass(frozen=True)
class LifeCycle:
    """One V2 life cycle: the spec's groups it holds (equal window, or all state) and
    its pools' bytes per slot (`create_storage_config`: one pool per buffer size)."""

    groups: tuple[LayerGroup, ...]
    pools: Sizes

    @property
    def group(self) -> LayerGroup:
        """The group whose page arithmetic the life cycle follows (all share kind and window)."""
        return self.groups[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)


def layer_buffers(spec: ModelSpec, g: LayerGroup) -> Sizes:
    """One layer's buffers in `g`, bytes per slot, as TensorRT-LLM's V2 managers declare
    them: the group's `buffers` when the spec has them (a state layer's conv and SSM
    state; an attention layer's rows times the page's tokens), else a state layer's one
    state and an attention layer's K and V (the row halved, times the page's tokens),
    each with its FP8 block scales as buffers of their own under NVFP4
    (`Role.KEY_BLOCK_SCALE`, one byte per 16 values)."""
    n = len(g.layers)
    if g.kind == "state":
        per_layer = g.state_bytes // n
        return g.buffers if g.buffers and sum(g.buffers) * n == g.state_bytes else (per_layer,)
    row, tpb = g.row_bytes // n, g.tokens_per_block
    if g.buffers and sum(g.buffers) * n == g.row_bytes:
        return tuple(b * tpb for b in g.buffers)
    if row * n != g.row_bytes or row % 2:
        return (g.page_bytes // n,)  # not K and V of one size: one buffer
    half = row // 2
    if spec.kv_dtype == "nvfp4":
        values = half * 16 // 9  # ceil(v / 2) + ceil(v / 16) = half when v is a multiple of 16
        if row_bytes(values, "nvfp4") != half or values % 16:
            raise LimitsError(
                f"group {g.name}: {half} NVFP4 bytes per row are not a whole number of 16-value blocks; "
                "TensorRT-LLM V2's data and scale buffers cannot be told apart"
            )
        data, scale = values // 2 * tpb, values // 16 * tpb
        return (data, data, scale, scale)
    return (half * tpb, half * tpb)


def life_cycles(spec: ModelSpec, groups: tuple[LayerGroup, ...] | None = None) -> tuple[LifeCycle, ...]:
    """V2's life cycles of `groups` (default: the spec's), in order of first appearance:
    groups of one window (None for full attention) are one life cycle, all state groups
    another; each life cycle's buffers of one size coalesce into one pool."""
    keyed: dict[tuple[bool, int | None], list[LayerGroup]] = {}
    for g in spec.groups if groups is None else groups:
        keyed.setdefault((g.kind == "state", None if g.kind in ("full", "state") else g.window), []).append(g)
    out = []
    for members in keyed.values():
        by_size: dict[int, int] = {}
        for g in members:
            for size in layer_buffers(spec, g):
                by_size[size] = by_size.get(size, 0) + size * len(g.layers)
        out.append(LifeCycle(tuple(members), tuple(sorted(by_size.values(), reverse=True))))
    return tuple(out)


def pool_groups(cycles: tuple[LifeCycle, ...]) -> dict[Sizes, list[LifeCycle]]:
    """Life cycles merged by equal slot size lists, in order of first appearance."""
    merged: dict[Sizes, list[LifeCycle]] = {}
    for lc in cycles:
        merged.setdefault(lc.pools, []).append(lc)
    return merged


def round_up(value: int, step: int) -> int:
    """`value` rounded up to a multiple of `step`."""
    return -(-value // step) * step


def grains_for_slots(slots: int, sizes: Sizes, gran: int) -> int:
    """Grains `slots` slots take: each pool rounded up to the granularity on its own."""
    return sum(-(-slots * s // gran) for s in sizes)


def slot_bytes(slots: int, sizes: Sizes, gran: int) -> int:
    """`slotsToBytes`: the bytes of `slots` slots, each pool rounded up to the granularity."""
    return grains_for_slots(slots, sizes, gran) * gran


def grains_to_slots(grains: int, sizes: Sizes, gran: int) -> tuple[int, int]:
    """(slots, grains used) of a pool group given `grains` (`grainsToSlots`): the grains
    split over its pools by size, smallest pool first, each at least one slot's grains;
    the fewest slots any pool holds, then raised while every pool still fits."""
    if grains < sum(-(-s // gran) for s in sizes):
        return 0, 0
    slots, remaining = 1 << 62, grains
    ascending = sorted(sizes)
    for j, size in enumerate(ascending):
        share = round(remaining * (size / sum(ascending[j:])))
        pool_grains = max(-(-size // gran), share)
        slots = min(slots, pool_grains * gran // size)
        remaining -= pool_grains
    step, hi = 1, slots + 1
    while grains_for_slots(hi, sizes, gran) <= grains:
        slots, step = hi, step * 2
        hi = slots + step
    while slots + 1 < hi:
        mid = slots + (hi - slots) // 2
        if grains_for_slots(mid, sizes, gran) <= grains:
            slots = mid
        else:
            hi = mid
    return slots, grains_for_slots(slots, sizes, gran)


def normalize(values: list[float] | list[int] | list[np.float32]) -> list[np.float32]:
    """`normalizeToRatio`: each value over their total, both cast to float32 first (an
    integer total is summed exactly, a float one in float32)."""
    if values and isinstance(values[0], (float, np.floating)):
        total = np.float32(0.0)
        for v in values:
            total = np.float32(total + np.float32(v))
    else:
        total = np.float32(sum(int(v) for v in values))
    if not total > 0:
        raise LimitsError("V2's ratio batch needs no slot in any life cycle")
    return [np.float32(np.float32(v) / total) for v in values]


def pool_group_ratio(lc_ratio: list[np.float32], lc_group: list[int], n_groups: int) -> list[np.float32]:
    """`toPoolGroupRatio`: life cycles' float32 ratios summed per pool group in float32,
    in life-cycle order, then normalised again."""
    sums = [np.float32(0.0)] * n_groups
    for r, pg in zip(lc_ratio, lc_group, strict=True):
        sums[pg] = np.float32(sums[pg] + r)
    return normalize(sums)


def water_fill(total: int, gran: int, sizes: list[Sizes], ratio: list[np.float32], floors: list[int]) -> list[int]:
    """Slots per pool group (`ratioToSlotCountList`): each round walks the active pool
    groups by ratio, smallest first, giving each `round(budget x its share of the ratios
    still to serve)` grains and passing on what its slots do not use; groups at or below
    their floor are pinned at the floor's grains and the rest go round again; last, each
    group takes the slots its grains still hold."""
    out = [0] * len(sizes)
    remaining = total
    active = list(range(len(sizes)))
    while active:
        budget = remaining
        got: dict[int, int] = {}
        order = sorted(active, key=lambda k: ratio[k])
        for i, k in enumerate(order):
            rest = sum(float(ratio[j]) for j in order[i:])
            share = float(ratio[k]) / rest if rest > 0 else 1.0
            got[k], used = grains_to_slots(round(budget * share), sizes[k], gran)
            budget -= used
        low = [k for k in active if got[k] <= floors[k]]
        if not low:
            for k in active:
                out[k] = got[k]
            break
        for k in low:
            out[k], used = grains_to_slots(grains_for_slots(floors[k], sizes[k], gran), sizes[k], gran)
            remaining -= used
        active = [k for k in active if k not in low]
        if active and remaining <= 0:
            raise LimitsError("insufficient quota to satisfy the pool groups' min slots")
    for k, s in enumerate(sizes):
        while grains_for_slots(out[k] + 1, s, gran) <= grains_for_slots(out[k], s, gran):
            out[k] += 1
    return out
