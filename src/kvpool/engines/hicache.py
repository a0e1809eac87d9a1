"""SGLang 0.5.23's HiCache host pools for a hybrid (attention + Mamba) model.

With `--enable-hierarchical-cache`, each device pool gets a host pool
(`mem_cache/hybrid_cache/hybrid_pool_assembler.py` `build_hybrid_mamba_stack`,
`mem_cache/pool_host/base.py` `HostKVCache`, `pool_host/mamba.py` `MambaPoolHost`):

- `--hicache-size S` (GB, 10^9 bytes, per rank): split over the device pools in
  proportion to their bytes (`_split_hicache_size`: `S x pool bytes / all pools'
  bytes`), each share then bought in its own unit: `int(share x 1e9 // bytes per
  token)` KV tokens, `int(share x 1e9 // bytes per state slot)` Mamba slots. (The
  double allocation of an older release, sglang #29034, is not 0.5.23's: the size
  is split, not given to each pool.)
- else `--hicache-ratio r`: `int(device tokens x r)` KV tokens and
  `int(device state slots x r)` Mamba slots.
- Each pool then keeps one padding page more: `(n // page + 1) x page` tokens
  (the Mamba pool's page is one slot).

A prefix found on host is usable only with its state checkpoint: a Mamba host pool
with fewer slots than the cached prefixes loses host hits (sglang PR #39436), so
the report names both pools and warns when the state pool is the smaller share.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.engines.common import EnginePool, EngineReport
from kvpool.errors import LimitsError

GB = 10**9


@dataclass(frozen=True)
class HostPools:
    """SGLang's HiCache host pools of one rank: KV tokens, Mamba state slots (0 for
    a model without state), their bytes, and how they were sized."""

    kv_tokens: int
    kv_bytes: int
    mamba_slots: int
    mamba_bytes: int
    rule: str

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.mamba_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "kv_tokens": self.kv_tokens,
            "kv_bytes": self.kv_bytes,
            "mamba_slots": self.mamba_slots,
            "mamba_bytes": self.mamba_bytes,
            "rule": self.rule,
        }


def split_size(size_gb: float, device_bytes: tuple[int, ...]) -> tuple[float, ...]:
    """`_split_hicache_size`: the host size in GB shared over the pools by their device bytes."""
    total = sum(device_bytes)
    return tuple(size_gb * b / total for b in device_bytes)


def padded(count: int, page: int) -> int:
    """A host pool's capacity with its padding page: `(count // page + 1) x page`."""
    return (count // page + 1) * page


def _by_size(full: EnginePool, state: EnginePool | None, size_gb: float) -> tuple[int, int, str]:
    """(KV tokens, Mamba slots, the rule) of `--hicache-size`: split by device bytes."""
    device = (full.bytes, *(() if state is None else (state.bytes,)))
    shares = split_size(size_gb, device)
    kv = int(shares[0] * GB // (full.page_bytes // full.page_tokens))
    slots = 0 if state is None else int(shares[1] * GB // state.page_bytes)
    return kv, slots, f"--hicache-size {size_gb:g} GB split by device bytes" + (" (KV, Mamba)" if state else "")


def _by_ratio(full: EnginePool, state: EnginePool | None, ratio: float) -> tuple[int, int, str]:
    """(KV tokens, Mamba slots, the rule) of `--hicache-ratio`: each device pool times it."""
    slots = 0 if state is None else int(state.pages * ratio)
    return int((full.tokens or 0) * ratio), slots, f"--hicache-ratio {ratio:g} x each device pool"


def sglang_host_pools(report: EngineReport, *, ratio: float = 2.0, size_gb: float | None = None) -> HostPools:
    """The host pools SGLang 0.5.23 builds beside the device pools of `report` (an
    SGLang report: its `full` pool and, for a Mamba hybrid, its `mamba` pool) under
    `--hicache-size size_gb` when given, else `--hicache-ratio ratio`."""
    if report.engine != "sglang":
        raise LimitsError(f"HiCache host pools are SGLang's; the report is {report.engine}'s")
    if ratio <= 0 or (size_gb is not None and size_gb <= 0):
        raise LimitsError("--hicache-ratio and --hicache-size must be positive")
    full = report.pool("full")
    page = full.page_tokens
    token_bytes = full.page_bytes // page
    state = next((p for p in report.pools if p.name == "mamba"), None)
    kv, slots, rule = _by_size(full, state, size_gb) if size_gb is not None else _by_ratio(full, state, ratio)
    kv_tokens = padded(kv, page)
    mamba_slots = 0 if state is None else padded(slots, 1)
    return HostPools(
        kv_tokens,
        kv_tokens * token_bytes,
        mamba_slots,
        0 if state is None else mamba_slots * state.page_bytes,
        rule,
    )
