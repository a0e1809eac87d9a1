"""Bundled facts: model configs, GPU figures, request traces (see data/*/README.md
for where each value comes from)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kvpool.errors import SpecError, UnknownPresetError

# the package folder's own path, as `importlib.resources.files` gives it for an unzipped package
# (whose import costs more than the rest of this module: it loads tempfile and zipfile)
DATA = Path(__file__).parent / "data"

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
# Presets whose entry carries its own short name ("key"), matched exactly: names
# such as "RTX 4090" or "L40" (a prefix of "L40S") cannot go by prefix.
KEYED_GPUS = ("h20", "l4", "l40", "rtx4090", "rtx5090", "b300", "gb300", "mi325x", "mi355x")
TRACES = {
    "azure-conv": "azure_llm_2023_conv.csv",
    "azure-code": "azure_llm_2023_code.csv",
    "mooncake-conv": "mooncake_conversation_trace.jsonl",
}


def _unknown(kind: str, name: str, names: list[str]) -> UnknownPresetError:
    import difflib  # here: only a misspelt name pays for it (about 1 ms of every start)

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
    _check_name("model", name)
    path = DATA / "models" / f"{name.lower()}.json"
    if not path.is_file() or name.lower() not in model_names():  # '../x' is a path, not a preset
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
    host_link: str | None = None  # pcie4_x16, pcie5_x16, pcie6_x16, nvlink_c2c (data/gpus.json "host_links")
    host_link_bytes_per_s: float | None = None  # host <-> GPU, per direction
    arch: str = ""  # architecture as data/gpus.json names it: "Ampere (GA100)", "Hopper (GH100)", "Blackwell", ...
    # GPU <-> GPU inside one node or NVLink domain (data/gpus.json "fabric_links"): its NVLink generation, else
    # its PCIe host link through a PCIe switch
    scale_up_link: str | None = None


@dataclass(frozen=True)
class FabricLink:
    """A link between two GPUs (data/gpus.json "fabric_links", and the PCIe
    host links through a switch): `bytes_per_s` per direction at the nominal
    data rate, `kind` scale-up (NVLink), scale-out (one NIC per GPU) or pcie,
    and where the figure comes from."""

    name: str
    kind: str
    bytes_per_s: float
    source: str


@cache
def _gpu_table() -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = json.loads((DATA / "gpus.json").read_text())["gpus"]
    return table


def gpu_names() -> list[str]:
    return [*GPU_ALIASES, *KEYED_GPUS]


def _gpu_row(key: str) -> dict[str, Any] | None:
    for row in _gpu_table():
        if row.get("key") == key:
            return row
    prefix = GPU_ALIASES.get(key)
    for row in _gpu_table():
        if prefix is not None and "key" not in row and str(row["name"]).split("-")[0].split(" ")[0] == prefix:
            return row
    return None


def host_links() -> dict[str, dict[str, Any]]:
    """Host <-> GPU links by name: `bytes_per_s` per direction and their `source`."""
    links: dict[str, dict[str, Any]] = json.loads((DATA / "gpus.json").read_text())["host_links"]
    return {k: v for k, v in links.items() if not k.startswith("_")}


def fabric_links() -> dict[str, FabricLink]:
    """GPU <-> GPU links by name: NVLink generations, InfiniBand and RoCE NICs,
    and the PCIe host links (`pcie5_x16`, ...) a GPU without NVLink reaches
    its neighbours over."""
    table: dict[str, dict[str, Any]] = json.loads((DATA / "gpus.json").read_text())["fabric_links"]
    links = {
        k: FabricLink(k, str(v["kind"]), float(v["bytes_per_s"]), str(v["source"]))
        for k, v in table.items()
        if not k.startswith("_")
    }
    for k, v in host_links().items():
        if k.startswith("pcie"):
            links[k] = FabricLink(k, "pcie", float(v["bytes_per_s"]), str(v["source"]))
    return links


def load_link(name: str) -> FabricLink:
    """A fabric link by name (`nvlink4`, `ib-ndr`, `roce-400gbe`, `pcie5-x16`;
    `-` and `_` alike, case-insensitive); UnknownPresetError with the closest
    names otherwise."""
    _check_name("link", name)
    links = fabric_links()
    key = name.lower().replace("-", "_")
    if key not in links:
        raise _unknown("link", name, sorted(links))
    return links[key]


def load_gpu(name: str) -> GpuSpec:
    """GPU preset by short name (`h100`, `B200`, `rtx4090`, ...; case-insensitive), or
    `auto`: this machine's GPU through NVML, with the memory it reports. Memory is
    what the device reports (nvidia-smi total) where known, else the marketed size."""
    _check_name("gpu", name)
    key = name.lower()
    if key == "auto":  # this machine's GPU, through NVML (presets/detect.py)
        from kvpool.presets.detect import detect

        spec: GpuSpec = detect()[0]
        return spec
    row = _gpu_row(key) if key in gpu_names() else None
    if row is None:
        raise _unknown("gpu", name, gpu_names())
    return _gpu_spec(key, row)


def _gpu_spec(key: str, row: dict[str, Any]) -> GpuSpec:
    """A row of gpus.json as a `GpuSpec`."""
    mib = row.get("device_reported_total_mib")
    memory = int(mib) * 2**20 if mib else int(row["memory_bytes_marketed"])
    fp8 = row.get("fp8_dense_tflops")
    link = row.get("host_link")
    return GpuSpec(
        key=key,
        name=str(row["name"]),
        memory_bytes=memory,
        hbm_bandwidth_bytes_per_s=float(row["hbm_bandwidth_bytes_per_s"]),
        bf16_flops=float(row["bf16_dense_tflops"]) * 1e12,
        fp8_flops=float(fp8) * 1e12 if fp8 else None,
        memory_source="device-reported" if mib else "marketed",
        source=str(row.get("source", "")),
        host_link=link,
        host_link_bytes_per_s=float(host_links()[link]["bytes_per_s"]) if link else None,
        arch=str(row.get("arch", "")),
        scale_up_link=row.get("scale_up_link") or (link if link and link.startswith("pcie") else None),
    )


def trace_names() -> list[str]:
    return list(TRACES)


def trace_path(name: str) -> Path:
    """Path of a bundled trace (`azure-conv`, `azure-code`, `mooncake-conv`)."""
    if name.lower() not in TRACES:
        raise _unknown("trace", name, trace_names())
    return DATA / "traces" / TRACES[name.lower()]


def _check_name(kind: str, name: object) -> None:
    """A preset name is a string: anything else is a typed error, not an AttributeError."""
    if not isinstance(name, str):
        raise SpecError(f"a {kind} preset name must be a string, got {type(name).__name__} {name!r}")
