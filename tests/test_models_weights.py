"""Weights: exact bytes from safetensors headers, parameter counts from configs
(against transformers and against published counts), quantized storage, and
the per-rank split under tensor / pipeline / expert / attention-data parallelism."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from kvpool.errors import KvpoolError
from kvpool.models.params import UnknownFamilyError, parameter_count
from kvpool.models.safetensors_headers import WeightsError, checkpoint_tensors, read_header
from kvpool.models.weights import weights_from_config
from kvpool.presets import load_model_config
from weights_helpers import (
    FAMILY_EXTRAS,
    header_json,
    random_tensors,
    raw_file,
    save_tensors,
    tiny_config,
)

DATA = Path(__file__).parent / "data"
SHAPES = {"a.weight": (7, 5), "b.bias": (3,), "c": (2, 3, 4), "empty": (0, 4)}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int64", "float64", "uint8"])
def test_header_bytes_equal_numpy_nbytes(tmp_path: Path, dtype: str) -> None:
    tensors = random_tensors(1, SHAPES, dtype)
    save_tensors(tmp_path / "model.safetensors", tensors)
    got = {t.name: t.nbytes for t in checkpoint_tensors(tmp_path)}
    assert got == {name: arr.nbytes for name, arr in tensors.items()}


def test_bf16_and_fp8_header_bytes_equal_torch_nbytes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors = {
        "w": torch.zeros(33, 17, dtype=torch.bfloat16),
        "s": torch.zeros(5, dtype=torch.float8_e4m3fn),
        "i": torch.zeros(4, 4, dtype=torch.int32),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"))
    assert sum(t.nbytes for t in checkpoint_tensors(tmp_path)) == sum(
        t.numel() * t.element_size() for t in tensors.values()
    )


def test_sharded_index_reads_each_named_shard_once(tmp_path: Path) -> None:
    one, two = random_tensors(2, {"x": (4, 4)}, "float32"), random_tensors(3, {"y": (8,), "z": (2, 2)}, "float16")
    save_tensors(tmp_path / "model-00001-of-00002.safetensors", one)
    save_tensors(tmp_path / "model-00002-of-00002.safetensors", two)
    save_tensors(tmp_path / "stray.safetensors", random_tensors(4, {"q": (100,)}, "float32"))  # not in the index
    weight_map = {"x": "model-00001-of-00002.safetensors", **dict.fromkeys(two, "model-00002-of-00002.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    total = sum(a.nbytes for a in [*one.values(), *two.values()])
    assert sum(t.nbytes for t in checkpoint_tensors(tmp_path)) == total
    weight_map["w"] = "model-00003-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(WeightsError, match="missing"):
        checkpoint_tensors(tmp_path)


def test_a_tensor_in_two_files_is_refused(tmp_path: Path) -> None:
    save_tensors(tmp_path / "a.safetensors", random_tensors(5, {"x": (2,)}, "float32"))
    save_tensors(tmp_path / "b.safetensors", random_tensors(6, {"x": (2,)}, "float32"))
    with pytest.raises(WeightsError, match="both"):
        checkpoint_tensors(tmp_path)


def test_only_the_header_is_read(tmp_path: Path) -> None:
    # a 4 GiB tensor in a sparse file: reading it would take far longer than the header
    n = 2**30
    header = header_json({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}})
    path = raw_file(tmp_path / "big.safetensors", header)
    with path.open("r+b") as f:
        f.truncate(8 + len(header) + 4 * n)
    start = time.perf_counter()
    assert [t.nbytes for t in read_header(path)] == [4 * n]
    assert time.perf_counter() - start < 1.0


def entry(dtype: str, shape: list[Any], offsets: list[Any]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


@pytest.mark.parametrize(
    ("header", "length", "data", "needle"),
    [
        (b"{}", 10**6, b"", "past the end"),
        (b"{}", 10**12, b"", "over the"),
        (b"not json at all", None, b"", "not JSON"),
        (b"[1, 2]", None, b"", "not a JSON object"),
        (header_json({"w": entry("F32", [-2], [0, 8])}), None, bytes(8), "bad shape"),
        (header_json({"w": entry("F32", [3], [0, 7])}), None, bytes(7), "data_offsets"),
        (header_json({"w": entry("F32", [2], [0, 8])}), None, bytes(4), "data section"),
        (header_json({"w": entry("F33", [2], [0, 8])}), None, bytes(8), "unknown dtype"),
        (header_json({"w": entry("F32", [2.5], [0, 10])}), None, bytes(10), "bad shape"),
        (header_json({"w": "x"}), None, b"", "not an object"),
    ],
)
def test_malformed_headers_raise_a_typed_error(
    tmp_path: Path, header: bytes, length: int | None, data: bytes, needle: str
) -> None:
    path = raw_file(tmp_path / "bad.safetensors", header, length=length, data=data)
    with pytest.raises(WeightsError, match=needle):
        read_header(path)
    assert issubclass(WeightsError, KvpoolError)


def test_a_file_shorter_than_the_length_field(tmp_path: Path) -> None:
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(WeightsError, match="shorter"):
        read_header(tmp_path / "short.safetensors")


# ----------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("family", sorted(FAMILY_EXTRAS))
def test_parameter_count_equals_transformers(family: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = tiny_config(family)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    # DeepSeek-V3's per-expert routing bias is a buffer in transformers but a stored tensor in the checkpoint
    buffers = sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    assert parameter_count(config) == sum(p.numel() for p in model.parameters()) + buffers


def published() -> list[tuple[str, dict[str, Any], float]]:
    out = []
    for row in json.loads((DATA / "published_params.json").read_text())["models"]:
        if "preset" in row:
            name, config = row["preset"], load_model_config(row["preset"])
        else:
            name, config = row["config"], json.loads((DATA / "configs" / f"{row['config']}.json").read_text())
        out.append((name, config, float(row["published_params"])))
    return out


def test_at_least_ten_presets_have_a_published_count() -> None:
    rows = json.loads((DATA / "published_params.json").read_text())["models"]
    assert sum("preset" in r for r in rows) >= 10 and all(r["source"] for r in rows)


@pytest.mark.parametrize(("name", "config", "count"), published(), ids=[p[0] for p in published()])
def test_parameter_count_within_one_percent_of_the_published_count(
    name: str, config: dict[str, Any], count: float
) -> None:
    assert abs(parameter_count(config) - count) <= 0.01 * count


def test_a_family_without_a_formula_is_refused_by_name() -> None:
    with pytest.raises(UnknownFamilyError, match="'qwen3_next'"):
        weights_from_config(load_model_config("qwen3-next-80b-a3b") | {"model_type": "qwen3_next"})
