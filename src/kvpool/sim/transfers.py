"""What moving KV pages between the GPU and the cold tiers costs a simulated step.

The manager keeps the books of the tiers (`cache/tiers.py`); it calls an
engine's `TierCopies` for every page it moves. `PageMoves` is the simulator's:
instead of copying it counts the bytes per direction, and `Link.seconds` turns
a step's bytes into time:

- **host <-> GPU** over the GPU's host link (`GpuSpec.host_link_bytes_per_s`,
  per direction, from data/gpus.json "host_links" with their sources: PCIe
  4.0/5.0/6.0 x16, NVLink-C2C). The link is full duplex, so pages coming in
  (onboarded prefix hits, resumed requests) and pages going out (offloaded
  evictions, suspended requests) move at the same time: a step's transfer
  time is `max(bytes in / bandwidth, bytes out / bandwidth)`.
- **disk -> GPU** goes through host memory: `bytes / min(disk, host link)`.
  The disk's default bandwidth is one NVMe drive on a PCIe 4.0 x4 link: 4
  lanes x 16 GT/s x 128/130 / 8 = 7.88 GB/s (PCI-SIG's figures, the same
  arithmetic as the x16 links); `--disk-bandwidth` sets a measured one.
- **host -> disk** (a full host tier spilling down) uses neither the GPU nor
  its link: counted, not timed.

How a step waits for its copies differs by engine; `overlap` picks one:

- `overlap=False` (default): the step's forward waits for its copies, which
  run on their own streams (TensorRT-LLM's block manager copies an offloaded
  block back in `onboardBlock` when a sequence is added, before the forward
  that reads it; evictions to the secondary pool likewise happen while blocks
  are allocated). Step time = compute + transfer.
- `overlap=True`: copies run asynchronously beside the forward (vLLM's
  offloading connector: DMA transfers on their own streams while the model
  runs other requests). Step time = max(compute, transfer): an optimistic
  bound, since vLLM delays only the request that waits for its load.

Both count every byte at the nominal link rate; measured copies reach less
(pinned-memory copies of small pages especially), so the times are a floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.errors import KvpoolError
from kvpool.media import COLD, Medium
from kvpool.presets import GpuSpec, host_links

# One NVMe drive on a PCIe 4.0 x4 link, per direction: a quarter of the PCIe 4.0 x16 figure of data/gpus.json.
PCIE4_LANE_BYTES_PER_S = 16e9 * 128 / 130 / 8
DEFAULT_DISK_BYTES_PER_S = 4 * PCIE4_LANE_BYTES_PER_S


def copy_seconds(nbytes: float, bytes_per_s: float) -> float:
    """Seconds `nbytes` keep a link of `bytes_per_s` (per direction) busy, at
    its nominal rate: the one arithmetic of every simulated copy (tier pages
    here, a prefill -> decode handoff in `kvpool.fleet`)."""
    return nbytes / bytes_per_s


@dataclass(frozen=True)
class Link:
    """Bandwidths (bytes/s, per direction) that tier copies use, and whether
    they overlap the forward (module docstring)."""

    host_bytes_per_s: float
    disk_bytes_per_s: float = DEFAULT_DISK_BYTES_PER_S
    overlap: bool = False

    def __post_init__(self) -> None:
        if not self.host_bytes_per_s > 0 or not self.disk_bytes_per_s > 0:
            raise KvpoolError(
                f"link bandwidths must be positive, got host {self.host_bytes_per_s}, disk {self.disk_bytes_per_s}"
            )

    @classmethod
    def of(
        cls,
        gpu: GpuSpec,
        *,
        host_bytes_per_s: float | None = None,
        disk_bytes_per_s: float | None = None,
        overlap: bool = False,
    ) -> Link:
        """`gpu`'s host link (or `host_bytes_per_s`), the disk's default (or
        `disk_bytes_per_s`); `KvpoolError` for a GPU preset without a host link."""
        host = host_bytes_per_s if host_bytes_per_s is not None else gpu.host_link_bytes_per_s
        if host is None:
            raise KvpoolError(
                f"{gpu.name} has no host link in its preset ({', '.join(host_links())}); give --host-bandwidth"
            )
        return cls(host, DEFAULT_DISK_BYTES_PER_S if disk_bytes_per_s is None else disk_bytes_per_s, overlap)

    def transfer_seconds(self, moved: Moved) -> float:
        """Seconds the copies of `moved` keep the link busy (full duplex: the
        longer direction; disk reads at the slower of disk and host link)."""
        host = self.host_bytes_per_s
        inbound = copy_seconds(moved.host_in, host) + copy_seconds(moved.disk_in, min(self.disk_bytes_per_s, host))
        return max(inbound, copy_seconds(moved.host_out, host))

    def step_seconds(self, compute_s: float, moved: Moved) -> float:
        """A step's time: its compute and its copies, one after the other or overlapped."""
        copies = self.transfer_seconds(moved)
        return max(compute_s, copies) if self.overlap else compute_s + copies


@dataclass
class Moved:
    """Bytes moved since the last `PageMoves.take`: into the GPU from host
    memory (`host_in`) and from disk (`disk_in`), out of the GPU to a cold tier
    (`host_out`; a suspended request parked on disk goes through host memory
    too), and from host to disk (`spilled`, off the GPU's link)."""

    host_in: int = 0
    disk_in: int = 0
    host_out: int = 0
    spilled: int = 0

    @property
    def empty(self) -> bool:
        return not (self.host_in or self.disk_in or self.host_out or self.spilled)


@dataclass
class PageMoves:
    """The simulator's `TierCopies` (`KVCacheManager.set_tier_copies`): copies
    nothing, counts bytes (`slot_bytes[g]` per page of group g) for the step
    in flight and pages for the whole run."""

    slot_bytes: list[int]
    step: Moved = field(default_factory=Moved)
    pages_in: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLD, 0))  # pages onboarded / resumed
    pages_out: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLD, 0))  # pages offloaded / suspended
    pages_spilled: int = 0

    def to_tier(self, group: int, page: int, medium: Medium, slot: int) -> None:
        self.step.host_out += self.slot_bytes[group]
        self.pages_out[medium] += 1

    def to_gpu(self, group: int, medium: Medium, slot: int, page: int) -> None:
        if medium == Medium.CPU:
            self.step.host_in += self.slot_bytes[group]
        else:
            self.step.disk_in += self.slot_bytes[group]
        self.pages_in[medium] += 1

    def between(self, group: int, src: Medium, src_slot: int, dst: Medium, dst_slot: int) -> None:
        self.step.spilled += self.slot_bytes[group]
        self.pages_spilled += 1

    def take(self) -> Moved:
        """The bytes moved since the last call; starts a new count."""
        moved, self.step = self.step, Moved()
        return moved
