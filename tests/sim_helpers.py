"""Factories of the simulator tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool.presets import GpuSpec

# A GPU with round numbers: 100 TFLOPS BF16, 1 TB/s, 10 GiB, no FP8 unless given.
TOY_GPU = GpuSpec(
    key="toy",
    name="toy",
    memory_bytes=10 * 2**30,
    hbm_bandwidth_bytes_per_s=1e12,
    bf16_flops=1e14,
    fp8_flops=None,
    memory_source="marketed",
    source="test",
)


def toy_gpu(**changes: Any) -> GpuSpec:
    """TOY_GPU with `changes` (e.g. fp8_flops=2e14, a host link)."""
    return dataclasses.replace(TOY_GPU, **changes)
