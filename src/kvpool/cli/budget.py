"""The one KV budget of every command: `--kv-memory SIZE`, or `--gpu NAME`
with the non-KV memory and `--memory-fraction F`, meaning (GPU memory -
non-KV memory) x F, F = 0.9 by default (the GPU's memory is what the device
reports, see `kvpool gpus`)."""

from __future__ import annotations

import argparse
from typing import NamedTuple

from kvpool import presets
from kvpool.errors import KvpoolError
from kvpool.units import format_bytes, parse_size

DEFAULT_MEMORY_FRACTION = 0.9


class Budget(NamedTuple):
    """KV bytes per rank and how they were derived (for the output)."""

    kv_bytes: int
    how: str


def memory_fraction(args: argparse.Namespace) -> float:
    """--memory-fraction (default 0.9), checked to lie in (0, 1]."""
    fraction = DEFAULT_MEMORY_FRACTION if args.memory_fraction is None else args.memory_fraction
    if not 0 < fraction <= 1:
        raise KvpoolError(f"--memory-fraction must be in (0, 1], got {fraction}")
    return float(fraction)


def kv_budget(
    args: argparse.Namespace, *, weights_bytes: float | None = None, gpu_only_for_budget: bool = True
) -> Budget:
    """KV bytes from --kv-memory, or from --gpu, the non-KV memory and
    --memory-fraction. The non-KV memory is --non-kv-memory, else
    `weights_bytes` when the caller knows the weights; without either, --gpu
    is refused with what to add. `gpu_only_for_budget`: --gpu means nothing
    but the budget here, so --kv-memory beside it is a contradiction (a command
    that also times steps on the GPU passes False)."""
    if args.kv_memory is not None:
        if (
            args.non_kv_memory is not None
            or args.memory_fraction is not None
            or (gpu_only_for_budget and args.gpu is not None)
        ):
            raise KvpoolError("give either --kv-memory or --gpu with --non-kv-memory [--memory-fraction], not both")
        return Budget(parse_size(args.kv_memory), f"--kv-memory {args.kv_memory}")
    if args.gpu is None:
        raise KvpoolError("no KV budget: give --kv-memory SIZE, or --gpu NAME --non-kv-memory SIZE")
    if args.non_kv_memory is not None:
        non_kv, how = parse_size(args.non_kv_memory), f"--non-kv-memory {args.non_kv_memory}"
    elif weights_bytes is not None:
        non_kv, how = int(weights_bytes), f"non-KV memory = weights {format_bytes(weights_bytes)}"
    else:
        raise KvpoolError("--gpu needs --non-kv-memory SIZE (weights, activations, CUDA graphs)")
    fraction = memory_fraction(args)
    gpu = presets.load_gpu(args.gpu)
    rest = gpu.memory_bytes - non_kv
    if rest <= 0:
        raise KvpoolError(f"{how} leaves no memory on {gpu.name} ({format_bytes(gpu.memory_bytes)})")
    return Budget(int(rest * fraction), f"({gpu.key} - {how}) x {fraction:g}")
