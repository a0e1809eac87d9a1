"""`--gpu auto`: the GPU of this machine through NVML (`nvidia-ml-py`, the `nvml`
extra): its name matched to a preset, its count, and the memory it reports.

The preset gives bandwidth and FLOPS; NVML's total memory replaces the table's,
since it is what an engine on this machine sees (`nvmlDeviceGetMemoryInfo`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any

from kvpool.errors import KvpoolError

# NVML names, e.g. "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090", "NVIDIA L40S":
# the preset is the word that names the chip (longest first, so L40S wins over L40
# and GB200 over B200).
PATTERNS = (
    ("gb300", r"GB300"),
    ("gb200", r"GB200"),
    ("b300", r"B300"),
    ("b200", r"B200"),
    ("h200", r"H200"),
    ("h100", r"H100"),
    ("h20", r"H20\b"),
    ("a100", r"A100"),
    ("l40s", r"L40S"),
    ("l40", r"L40\b"),
    ("l4", r"L4\b"),
    ("a10", r"A10\b|A10G\b"),
    ("rtx5090", r"RTX 5090"),
    ("rtx4090", r"RTX 4090"),
)


class GpuDetectionError(KvpoolError):
    """No GPU could be read on this machine, or its name matches no preset."""


def preset_for(nvml_name: str) -> str | None:
    """The preset key an NVML device name names, else None."""
    for key, pattern in PATTERNS:
        if re.search(pattern, nvml_name, re.IGNORECASE):
            return key
    return None


def _text(value: Any) -> str:
    """A device name as NVML gives it (bytes in older bindings), undecodable bytes shown as \ufffd."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def detect() -> tuple[Any, int]:
    """(GpuSpec of device 0 with NVML's total memory, number of devices). Raises
    GpuDetectionError without nvidia-ml-py, without a driver, without a device,
    or for a device no preset describes (naming it)."""
    from kvpool import presets

    try:
        import pynvml
    except ImportError:
        raise GpuDetectionError("--gpu auto reads the GPU through NVML: pip install 'kvpool[nvml]'") from None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError: no driver, no device
        raise GpuDetectionError(f"--gpu auto: NVML cannot start ({e}); give --gpu NAME (kvpool gpus)") from None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        if count < 1:
            raise GpuDetectionError("--gpu auto: NVML sees no GPU; give --gpu NAME (kvpool gpus)")
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except GpuDetectionError:
        raise
    except Exception as e:  # NVMLError after init: a lost device, a driver that went away, a bad reply
        raise GpuDetectionError(f"--gpu auto: NVML cannot read GPU 0 ({e}); give --gpu NAME (kvpool gpus)") from None
    finally:
        with contextlib.suppress(Exception):  # a failing shutdown must not hide the answer or the error
            pynvml.nvmlShutdown()
    if total <= 0:
        raise GpuDetectionError(f"--gpu auto: NVML reports {total} bytes on {name!r}; give --gpu NAME (kvpool gpus)")
    key = preset_for(name)
    if key is None:
        raise GpuDetectionError(f"--gpu auto: no preset describes {name!r}; give --gpu NAME (kvpool gpus)")
    spec = presets.load_gpu(key)
    return dataclasses.replace(spec, memory_bytes=total, memory_source=f"NVML ({name})"), count
