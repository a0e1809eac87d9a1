"""GPU presets (H20, L4, L40, RTX 4090/5090, B300, GB300, MI325X, MI355X),
host links, and `--gpu auto` through NVML, tested with a stand-in `pynvml`."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from kvpool import presets
from kvpool.presets.detect import GpuDetectionError, detect, preset_for

NEW = ("h20", "l4", "l40", "rtx4090", "rtx5090", "b300", "gb300", "mi325x", "mi355x")


@pytest.mark.parametrize("key", NEW)
def test_new_presets_load_with_a_source_and_a_host_link(key: str) -> None:
    gpu = presets.load_gpu(key)
    assert gpu.key == key and gpu.source and gpu.memory_bytes > 20e9
    assert gpu.host_link in presets.host_links() and gpu.host_link_bytes_per_s
    assert gpu.bf16_flops > 0 and gpu.hbm_bandwidth_bytes_per_s > 0


def test_presets_that_share_a_prefix_stay_apart() -> None:
    """L40 is no L40S, H20 no H200, B300 no GB300 (the prefix match cannot tell them)."""
    pairs = [("l40", "l40s"), ("h20", "h200"), ("b300", "gb300"), ("b200", "gb200")]
    for a, b in pairs:
        assert presets.load_gpu(a).name != presets.load_gpu(b).name


def test_marketed_sizes_are_what_the_vendors_state() -> None:
    """Decimal GB as marketed (the datasheets quoted in gpus.json): 96, 24, 48, 288, 256."""
    for key, gb in (("h20", 96), ("l4", 24), ("l40", 48), ("rtx5090", 32), ("b300", 288), ("mi325x", 256)):
        assert presets.load_gpu(key).memory_bytes == gb * 10**9


def test_host_links_follow_the_lane_arithmetic() -> None:
    """PCIe x16 per direction: GT/s x 16 lanes / 8 bits x encoding efficiency (PCI-SIG)."""
    links = presets.host_links()
    assert links["pcie4_x16"]["bytes_per_s"] == pytest.approx(16e9 * 16 / 8 * 128 / 130, rel=1e-3)
    assert links["pcie5_x16"]["bytes_per_s"] == pytest.approx(32e9 * 16 / 8 * 128 / 130, rel=1e-3)
    assert links["nvlink_c2c"]["bytes_per_s"] == 900e9 / 2
    assert all(v["source"] for v in links.values())


def test_gpus_command_lists_them(cli: Any) -> None:
    code, out, err = cli("gpus", "--json")
    assert code == 0, err
    listed = json.dumps(json.loads(out))
    assert all(key in listed for key in NEW)


class NVMLError(Exception):
    """What nvidia-ml-py raises (pynvml.NVMLError)."""


def fake_nvml(name: str | bytes, count: int, total: int, *, fail: bool = False, failing: str = "") -> types.ModuleType:
    """A stand-in for nvidia-ml-py's `pynvml` with the calls detect() makes;
    `failing` names one that raises NVMLError after init."""
    nvml = types.ModuleType("pynvml")
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def shutdown() -> None:
        calls.append("shutdown")
        if failing == "nvmlShutdown":
            raise NVMLError("Uninitialized")

    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda h: name  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=total, free=total, used=0)  # type: ignore[attr-defined]
    if failing and failing != "nvmlShutdown":

        def lost(*_: Any) -> None:
            raise NVMLError("GPU is lost")

        setattr(nvml, failing, lost)
    nvml.calls = calls  # type: ignore[attr-defined]
    return nvml


def test_auto_reads_the_device_and_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml(b"NVIDIA H100 80GB HBM3", 8, 85_520_809_984)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    gpu, count = detect()
    assert (gpu.key, count, gpu.memory_bytes) == ("h100", 8, 85_520_809_984)
    assert "NVML" in gpu.memory_source and nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    assert presets.load_gpu("auto").memory_bytes == 85_520_809_984


def test_fit_auto_uses_every_gpu(monkeypatch: pytest.MonkeyPatch, cli: Any) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml("NVIDIA H100 80GB HBM3", 2, 85_520_809_984))
    code, out, err = cli("fit", "qwen3-32b", "--gpu", "auto", "--max-seq-len", "32768", "--engine", "vllm", "--json")
    assert code == 0, err
    auto = json.loads(out)
    code, out, err = cli("fit", "qwen3-32b", "--gpu", "h100x2", "--max-seq-len", "32768", "--engine", "vllm", "--json")
    assert auto["gpus"] == 2 and auto["layout"]["tp"] == 2
    assert auto["kv_bytes_per_rank"] == json.loads(out)["kv_bytes_per_rank"]  # same memory as the table's


@pytest.mark.parametrize(
    ("nvml", "message"),
    [
        (fake_nvml("NVIDIA H100", 1, 1, fail=True), "NVML cannot start"),
        (fake_nvml("NVIDIA H100", 0, 1), "sees no GPU"),
        (fake_nvml("NVIDIA Quadro P400", 1, 2 << 30), "no preset describes 'NVIDIA Quadro P400'"),
        # NVML errors after init, and a name that is not UTF-8, were internal errors
        (fake_nvml("NVIDIA H100", 1, 1, failing="nvmlDeviceGetCount"), "GPU is lost"),
        (fake_nvml("NVIDIA H100", 1, 1, failing="nvmlDeviceGetHandleByIndex"), "GPU is lost"),
        (fake_nvml("NVIDIA H100", 1, 1, failing="nvmlDeviceGetName"), "GPU is lost"),
        (fake_nvml("NVIDIA H100", 1, 1, failing="nvmlDeviceGetMemoryInfo"), "GPU is lost"),
        (fake_nvml(b"NVIDIA \xff\xfe X", 1, 2 << 30), "no preset describes 'NVIDIA \ufffd\ufffd X'"),
        (fake_nvml("NVIDIA H100 80GB HBM3", 1, 0), "reports 0 bytes"),
    ],
)
def test_auto_failures_are_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, cli: Any, nvml: types.ModuleType, message: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    code, out, err = cli("plan", "qwen3-8b", "--gpu", "auto")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_failing_shutdown_hides_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "pynvml", fake_nvml("NVIDIA H100 80GB HBM3", 8, 85_520_809_984, failing="nvmlShutdown")
    )
    assert detect()[0].key == "h100"


def test_auto_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(GpuDetectionError, match=r"kvpool\[nvml\]"):
        detect()


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A10G", "a10"),
        ("Tesla T4", None),
    ],
)
def test_nvml_names_map_to_presets(name: str, key: str | None) -> None:
    assert preset_for(name) == key
