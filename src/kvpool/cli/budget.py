"""The one KV budget of every command, per rank:

- `--kv-memory SIZE`: that;
- `--gpu NAME --non-kv-memory SIZE`: (GPU memory - non-KV memory) x F,
  F = `--memory-fraction` (0.9 by default);
- `--gpu NAME` alone: the whole GPU (plan/memory.py): GPU memory x utilization
  (`--gpu-memory-utilization`, the same option, 0.9 by default as in vLLM) -
  weights per rank - activation peak - CUDA-graph pool - reserve, each estimated
  unless given (`--weights-memory`, `--activation-memory`, `--cuda-graph-memory`,
  `--reserved-memory`); `--non-kv-memory` replaces all four.

The GPU's memory is what the device reports (`kvpool gpus`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NamedTuple

from kvpool import presets
from kvpool.cli.common import parallel_from_args
from kvpool.errors import KvpoolError
from kvpool.models.weights import model_weights
from kvpool.plan.limits import ServingLimits
from kvpool.plan.memory import (
    DEFAULT_RESERVED,
    DEFAULT_UTILIZATION,
    MemoryBudget,
    activation_bytes,
    cuda_graph_bytes,
)
from kvpool.spec.defaults import with_defaults
from kvpool.spec.loader import read_model_config
from kvpool.units import format_bytes, parse_size

DEFAULT_MEMORY_FRACTION = DEFAULT_UTILIZATION
PARTS = ("weights_memory", "activation_memory", "cuda_graph_memory", "reserved_memory")


class Budget(NamedTuple):
    """KV bytes per rank, how they were derived, and the whole-GPU breakdown when
    the budget came from `--gpu` alone."""

    kv_bytes: int
    how: str
    memory: MemoryBudget | None = None


def memory_fraction(args: argparse.Namespace) -> float:
    """--memory-fraction / --gpu-memory-utilization (default 0.9), checked to lie in (0, 1]."""
    fraction = DEFAULT_MEMORY_FRACTION if args.memory_fraction is None else args.memory_fraction
    if not 0 < fraction <= 1:
        raise KvpoolError(f"--memory-fraction must be in (0, 1], got {fraction}")
    return float(fraction)


def _size_or_zero(text: str) -> int:
    return 0 if text.strip() in ("0", "0B", "0b") else parse_size(text)


def _flag(part: str) -> str:
    return "--" + part.replace("_", "-")


def kv_budget(
    args: argparse.Namespace,
    limits: ServingLimits,
    *,
    weights_bytes: int | None = None,
    gpu_only_for_budget: bool = True,
) -> Budget:
    """KV bytes per rank from the budget options (module docstring). `weights_bytes`:
    the caller's per-rank weights when it knows better than the checkpoint (simulate's
    --weights-bytes). `gpu_only_for_budget`: --gpu means nothing but the budget, so
    --kv-memory beside it is a contradiction (a command that also times steps on the
    GPU passes False). Reads the model's config and safetensors headers; raises
    KvpoolError on contradictory options or a budget that leaves no KV memory."""
    given = [_flag(p) for p in PARTS if getattr(args, p, None) is not None]
    if args.kv_memory is not None:
        if (
            args.non_kv_memory is not None
            or args.memory_fraction is not None
            or given
            or (gpu_only_for_budget and args.gpu is not None)
        ):
            raise KvpoolError("give either --kv-memory or --gpu [--non-kv-memory | the memory estimates], not both")
        return Budget(parse_size(args.kv_memory), f"--kv-memory {args.kv_memory}")
    if args.gpu is None:
        raise KvpoolError("no KV budget: give --kv-memory SIZE, or --gpu NAME (with --tp N for the weights per rank)")
    gpu = presets.load_gpu(args.gpu)
    fraction = memory_fraction(args)
    if args.non_kv_memory is not None:
        if given:
            raise KvpoolError(f"--non-kv-memory replaces {', '.join(given)}; give one or the other")
        non_kv, how = parse_size(args.non_kv_memory), f"--non-kv-memory {args.non_kv_memory}"
        rest = gpu.memory_bytes - non_kv
        if rest <= 0:
            raise KvpoolError(f"{how} leaves no memory on {gpu.name} ({format_bytes(gpu.memory_bytes)})")
        return Budget(int(rest * fraction), f"({gpu.key} - {how}) x {fraction:g}")
    memory = whole_gpu(args, limits, gpu.memory_bytes, fraction, weights_bytes)
    memory.check(gpu.name, parallel_from_args(args))
    return Budget(memory.kv_bytes, f"{gpu.key} x {fraction:g} - weights - activations - CUDA graphs - reserve", memory)


def model_facts(model: str) -> tuple[dict[str, Any], str | Path]:
    """(config with transformers' values for omitted fields, where its weights'
    headers are looked for): a hub id's cache snapshot, else MODEL itself."""
    _, _, raw, origin = read_model_config(model)
    return with_defaults(raw), (origin.folder if origin is not None and origin.folder else model)


def whole_gpu(
    args: argparse.Namespace, limits: ServingLimits, gpu_bytes: int, utilization: float, weights_bytes: int | None
) -> MemoryBudget:
    """The per-rank breakdown of `--gpu` alone: each part from its flag, else estimated."""
    config, folder = model_facts(args.model)
    par = parallel_from_args(args)
    how: dict[str, str] = {}
    values: dict[str, int] = {}
    for part in PARTS:
        text = getattr(args, part, None)
        if text is not None:
            values[part], how[part] = _size_or_zero(text), f"{_flag(part)} {text}"
    if "weights_memory" not in values:
        if weights_bytes is not None:
            values["weights_memory"], how["weights_memory"] = weights_bytes, "--weights-bytes / tp"
        else:
            weights = model_weights(config, folder)
            values["weights_memory"], how["weights_memory"] = weights.per_rank_bytes(par), weights.source
    if "activation_memory" not in values:
        values["activation_memory"] = activation_bytes(config, limits, par)
        how["activation_memory"] = f"estimate: {limits.max_num_tokens or limits.max_seq_len} tokens + logits"
    if "cuda_graph_memory" not in values:
        values["cuda_graph_memory"] = cuda_graph_bytes(config, limits, par)
        how["cuda_graph_memory"] = f"estimate: activations of batch {limits.largest_graph_batch}"
    if "reserved_memory" not in values:
        values["reserved_memory"], how["reserved_memory"] = DEFAULT_RESERVED, "kvpool's default allowance"
    return MemoryBudget(
        gpu_bytes,
        utilization,
        values["weights_memory"],
        values["activation_memory"],
        values["cuda_graph_memory"],
        values["reserved_memory"],
        {p.removesuffix("_memory"): h for p, h in how.items()},
    )
