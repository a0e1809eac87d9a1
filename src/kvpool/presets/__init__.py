"""Bundled facts: model configs, GPU figures, request traces (see data/*/README.md
for where each value comes from)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvpool.errors import SpecError, UnknownPresetError

DATA = Path(str(resources.files("kvpool.presets") / "data"))

# Short GPU names -> entries of data/gpus.json (matched by prefix of "name").
GPU_ALIASES = {
    "a10": "A10",
    "l40s": "L40S",
    "a100": "A100",
    "h100": "H100",
    "h200": "H200",
    "b200": "B200",
    "gb200": "GB200",
    "mi300x": "MI300X",
}
TRACES = {
    "azure-conv": "azure_llm_2023_conv.csv",
    "azure-code": "azure_llm_2023_code.csv",
    "mooncake-conv": "mooncake_conversation_trace.jsonl",
}


def _unknown(kind: str, name: str, names: list[str]) -> UnknownPresetError:
    close = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.4)
    if not close:
        close = [n for n in names if name.lower() in n or n in name.lower()][:3]
    return UnknownPresetError(kind, name, close, names)


def model_names() -> list[str]:
    """Names of the bundled model presets (file names without `.json`)."""
    return sorted(p.stem for p in (DATA / "models").glob("*.json"))


def load_model_config(name: str) -> dict[str, Any]:
    """The bundled config dict of preset `name`; UnknownPresetError with the
    closest names otherwise."""
    path = DATA / "models" / f"{name.lower()}.json"
    if not path.is_file():
        raise _unknown("model", name, model_names())
    config: dict[str, Any] = json.loads(path.read_text())
    config.setdefault("_name_or_path", name.lower())
    return config


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's figures (per device; TFLOPS dense)."""

    key: str
    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None
    memory_source: str  # "device-reported" (nvidia-smi total) or "marketed"
    source: str


@cache
def _gpu_table() -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = json.loads((DATA / "gpus.json").read_text())["gpus"]
    return table


def gpu_names() -> list[str]:
    return list(GPU_ALIASES)


def load_gpu(name: str) -> GpuSpec:
    """GPU preset by short name (`h100`, `B200`, ...; case-insensitive). Memory is
    what the device reports (nvidia-smi total) where known, else the marketed size."""
    key = name.lower()
    if key not in GPU_ALIASES:
        raise _unknown("gpu", name, gpu_names())
    prefix = GPU_ALIASES[key]
    for row in _gpu_table():
        if str(row["name"]).split("-")[0].split(" ")[0] == prefix:
            mib = row.get("device_reported_total_mib")
            memory = int(mib) * 2**20 if mib else int(row["memory_bytes_marketed"])
            fp8 = row.get("fp8_dense_tflops")
            return GpuSpec(
                key=key,
                name=str(row["name"]),
                memory_bytes=memory,
                hbm_bandwidth_bytes_per_s=float(row["hbm_bandwidth_bytes_per_s"]),
                bf16_flops=float(row["bf16_dense_tflops"]) * 1e12,
                fp8_flops=float(fp8) * 1e12 if fp8 else None,
                memory_source="device-reported" if mib else "marketed",
                source=str(row.get("source", "")),
            )
    raise SpecError(f"gpu preset {name!r} is missing from gpus.json")  # pragma: no cover


def trace_names() -> list[str]:
    return list(TRACES)


def trace_path(name: str) -> Path:
    """Path of a bundled trace (`azure-conv`, `azure-code`, `mooncake-conv`)."""
    if name.lower() not in TRACES:
        raise _unknown("trace", name, trace_names())
    return DATA / "traces" / TRACES[name.lower()]
