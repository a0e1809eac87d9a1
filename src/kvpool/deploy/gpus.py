"""`--gpu NAME[xN]`: a GPU preset and how many of them, read the same way by
every command (`h100x2`: two H100s; `auto`: this machine's GPUs through NVML)."""

from __future__ import annotations

import re

from kvpool import presets
from kvpool.errors import KvpoolError

GPU_COUNT = re.compile(r"(?P<name>.+?)x(?P<count>[1-9][0-9]*)", re.IGNORECASE)
MAX_GPUS = 64


def split_gpu(text: str) -> tuple[str, int | None]:
    """`h100x2` -> ("h100", 2); `h100` -> ("h100", None: no count given); `auto`
    -> ("auto", the GPUs NVML sees). A preset whose own name ends in x<digits>
    wins over the count. Raises KvpoolError for an unknown preset or more than 64 GPUs."""
    if not isinstance(text, str):
        raise KvpoolError(f"--gpu must be a GPU preset name such as h100 or h100x2, got {text!r}")
    if text.lower() == "auto":  # this machine's GPUs, all of them
        from kvpool.presets.detect import detect

        return "auto", detect()[1]
    match = GPU_COUNT.fullmatch(text)
    if match is None or text.lower() in presets.gpu_names():
        presets.load_gpu(text)
        return text, None
    count = int(match["count"])
    if count > MAX_GPUS:
        raise KvpoolError(f"--gpu {text}: at most {MAX_GPUS} GPUs")
    presets.load_gpu(match["name"])
    return match["name"], count


def gpu_and_count(text: str) -> str:
    """`text` if `split_gpu` reads it (`auto` is read later, through NVML), for
    argparse: the command reads it again and prints it as given."""
    if text.lower() != "auto":
        split_gpu(text)
    return text
