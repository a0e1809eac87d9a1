"""Where a page of KV lives: the GPU pools, or a cold tier below them (host
memory, disk). One enum for every layer; its values are kvpool's own names,
which the events map to each consumer's (`cache/kv_wire.py`: vLLM calls the
disk tier STORAGE, Dynamo reads CPU_PINNED as host memory)."""

from __future__ import annotations

from enum import StrEnum


class Medium(StrEnum):
    """A tier of KV memory, warm to cold. A `str`: "GPU", "CPU" (host memory),
    "DISK", so it prints, compares and serializes as its name."""

    GPU = "GPU"
    CPU = "CPU"
    DISK = "DISK"


COLD: tuple[Medium, ...] = (Medium.CPU, Medium.DISK)  # the cold tiers, warm to cold
