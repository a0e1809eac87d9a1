"""Exact weight bytes of a safetensors checkpoint, read from the headers only.

A `.safetensors` file starts with an 8-byte little-endian unsigned length n,
then n bytes of JSON: `{tensor name: {"dtype", "shape", "data_offsets"}, ...}`
plus an optional `"__metadata__"` entry (format: huggingface/safetensors
README, "Format"). Only those n + 8 bytes are read, never the tensors. A tensor
costs `prod(shape) x dtype size` bytes, which must equal
`data_offsets[1] - data_offsets[0]`; anything else is a corrupt file and is
refused with `WeightsError`, as is a header longer than the file or than
`MAX_HEADER_BYTES` (the safetensors library's own limit is 100 MB).

A sharded checkpoint has `model.safetensors.index.json` whose `weight_map`
names the shard of each tensor; every shard it names is read once. Without an
index every `*.safetensors` file in the folder is read.
"""

from __future__ import annotations

import math
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool import jsonsafe
from kvpool.errors import KvpoolError

MAX_HEADER_BYTES = 100_000_000
INDEX_NAME = "model.safetensors.index.json"

# bits per element of each safetensors dtype (safetensors README, "Format")
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class WeightsError(KvpoolError):
    """A checkpoint's weights cannot be read or sized (corrupt header, bad index)."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its header states it: name, dtype, shape and stored bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def _fail(path: Path, why: str) -> WeightsError:
    return WeightsError(f"safetensors file {path}: {why}")


def read_header(path: Path) -> list[TensorHeader]:
    """The tensors one `.safetensors` file declares. Reads the first 8 + n bytes
    only. Raises WeightsError for a short file, a header length beyond the file
    or MAX_HEADER_BYTES, a header that is not a JSON object, or a tensor whose
    dtype, shape or offsets do not add up."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read below until a writer came
            raise _fail(path, "not a regular file (a pipe or a device?)")
        size = info.st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _fail(path, f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise _fail(path, f"header length {n:,} is over the {MAX_HEADER_BYTES:,}-byte limit")
            if 8 + n > size:
                raise _fail(path, f"header length {n:,} runs past the end of the {size:,}-byte file")
            raw = f.read(n)
    except OSError as e:
        raise _fail(path, f"cannot read: {e}") from None
    try:
        header = jsonsafe.loads(raw)
    except jsonsafe.JSONValueError as e:
        raise _fail(path, f"header is not JSON kvpool reads ({e})") from None
    if not isinstance(header, dict):
        raise _fail(path, "header is not a JSON object")
    data_bytes = size - 8 - n
    return [_tensor(path, name, entry, data_bytes) for name, entry in header.items() if name != "__metadata__"]


def _tensor(path: Path, name: str, entry: Any, data_bytes: int) -> TensorHeader:
    if not isinstance(entry, dict):
        raise _fail(path, f"tensor {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _fail(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise _fail(path, f"tensor {name!r} has a bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise _fail(path, f"tensor {name!r} has bad data_offsets {offsets!r}")
    begin, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    nbytes = -(-bits // 8)
    if not 0 <= begin <= end <= data_bytes or end - begin != nbytes:
        raise _fail(
            path,
            f"tensor {name!r}: {dtype} {shape} is {nbytes:,} bytes but data_offsets {offsets} "
            f"(data section {data_bytes:,} bytes)",
        )
    return TensorHeader(name, str(dtype), tuple(shape), nbytes)


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: the shards the index names
    (each once), else every `*.safetensors` file. Empty when there are none.
    Raises WeightsError for an unreadable index or a shard it names that is missing."""
    index = folder / INDEX_NAME
    if not index.exists():
        return sorted(folder.glob("*.safetensors"))
    if not index.is_file():  # through links; a FIFO would block the read
        raise WeightsError(f"cannot read {index}: not a regular file (a pipe or a device?)")
    try:
        with index.open("rb") as f:
            weight_map = jsonsafe.loads(f.read(MAX_HEADER_BYTES + 1))["weight_map"]
        shards = sorted({str(v) for v in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # jsonsafe's JSONValueError included
        raise WeightsError(f"cannot read {index}: {str(e)[:200]}") from None
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise WeightsError(f"{index} names shards that are missing: {', '.join(missing)}")
    return [folder / s for s in shards]


def checkpoint_tensors(folder: Path) -> list[TensorHeader]:
    """Every tensor of the checkpoint in `folder` (headers only; see checkpoint_files).
    A tensor name found in two files is refused: the bytes would count twice."""
    seen: dict[str, Path] = {}
    out: list[TensorHeader] = []
    for path in checkpoint_files(folder):
        for t in read_header(path):
            if t.name in seen:
                raise WeightsError(f"tensor {t.name!r} is in both {seen[t.name].name} and {path.name}")
            seen[t.name] = path
            out.append(t)
    return out
