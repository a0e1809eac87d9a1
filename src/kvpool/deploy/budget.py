"""The one KV budget of every command, per rank:

- `--kv-memory SIZE`: that;
- `--gpu NAME --non-kv-memory SIZE`: (GPU memory - non-KV memory) x F,
  F = `--memory-fraction` (0.9 by default);
- `--gpu NAME` alone: the whole GPU (plan/memory.py): GPU memory x utilization
  (`--gpu-memory-utilization`, the same option, 0.9 by default as in vLLM) -
  weights per rank - activation peak - CUDA-graph pool - reserve, each estimated
  unless given (`--weights-memory`, `--activation-memory`, `--cuda-graph-memory`,
  `--reserved-memory`); `--non-kv-memory` replaces all four.

The GPU's memory is what the device reports (`kvpool gpus`). Errors name the
options as the command line spells them (`kv_memory` is `--kv-memory`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kvpool import presets
from kvpool.deploy.options import BudgetOptions, ModelOptions, flag
from kvpool.errors import KvpoolError
from kvpool.models.params import ParameterCountError
from kvpool.models.weight_dtype import WeightSchemeError
from kvpool.plan.limits import ServingLimits
from kvpool.plan.memory import (
    DEFAULT_RESERVED,
    DEFAULT_UTILIZATION,
    MemoryBudget,
    activation_bytes,
    cuda_graph_bytes,
    forward_peak,
    sampler_peak,
)
from kvpool.presets import GpuSpec
from kvpool.spec import ModelSpec
from kvpool.units import format_bytes, parse_size, size_or_zero

if TYPE_CHECKING:  # loaded where the weights are counted (`weights_facts`, `weights_per_rank`)
    from kvpool.models.weights import Parallel

DEFAULT_MEMORY_FRACTION = DEFAULT_UTILIZATION


class Budget(NamedTuple):
    """KV bytes per rank, how they were derived, and the whole-GPU breakdown when
    the budget came from `--gpu` alone."""

    kv_bytes: int
    how: str
    memory: MemoryBudget | None = None


def memory_fraction(options: BudgetOptions) -> float:
    """--memory-fraction / --gpu-memory-utilization (default 0.9), checked to lie in (0, 1]."""
    fraction = DEFAULT_MEMORY_FRACTION if options.memory_fraction is None else options.memory_fraction
    if not 0 < fraction <= 1:
        raise KvpoolError(f"--memory-fraction must be in (0, 1], got {fraction}")
    return float(fraction)


def kv_budget(
    options: BudgetOptions,
    model: ModelOptions,
    spec: ModelSpec,
    limits: ServingLimits,
    *,
    weights_bytes: int | None = None,
    gpu_only_for_budget: bool = True,
) -> Budget:
    """KV bytes per rank from the budget options (module docstring), for the model
    `spec` was loaded from (its config and weights' folder; nothing is read again
    but the safetensors headers). `weights_bytes`: the caller's per-rank weights
    when it knows better than the checkpoint (simulate's --weights-bytes).
    `gpu_only_for_budget`: --gpu means nothing but the budget, so --kv-memory beside
    it is a contradiction (a command that also times steps on the GPU passes False).
    Raises KvpoolError on contradictory options or a budget that leaves no KV memory."""
    given = [flag(p) for p, _ in options.parts]
    if options.kv_memory is not None:
        return given_kv(options, given, gpu_only_for_budget)
    if options.gpu is None:
        raise KvpoolError("no KV budget: give --kv-memory SIZE, or --gpu NAME (with --tp N for the weights per rank)")
    gpu = presets.load_gpu(options.gpu)
    fraction = memory_fraction(options)
    check_parts(options, gpu)
    if options.non_kv_memory is not None:
        return rest_of_gpu(options.non_kv_memory, given, gpu, fraction)
    memory = whole_gpu(options, model, spec, limits, gpu.memory_bytes, fraction, weights_bytes)
    memory.check(gpu.name, model.parallel)
    return Budget(memory.kv_bytes, f"{gpu.key} x {fraction:g} - weights - activations - CUDA graphs - reserve", memory)


def given_kv(options: BudgetOptions, given: list[str], gpu_only_for_budget: bool) -> Budget:
    """`--kv-memory SIZE`, refused beside any option that would derive it."""
    assert options.kv_memory is not None
    beside = options.non_kv_memory is not None or options.memory_fraction is not None or given
    if beside or (gpu_only_for_budget and options.gpu is not None):
        raise KvpoolError("give either --kv-memory or --gpu [--non-kv-memory | the memory estimates], not both")
    kv = parse_size(options.kv_memory)
    check_kv_memory(kv, options.kv_memory, options.gpu)
    return Budget(kv, f"--kv-memory {options.kv_memory}")


def rest_of_gpu(non_kv_memory: str, given: list[str], gpu: GpuSpec, fraction: float) -> Budget:
    """`--gpu NAME --non-kv-memory SIZE`: (GPU memory - SIZE) x F."""
    if given:
        raise KvpoolError(f"--non-kv-memory replaces {', '.join(given)}; give one or the other")
    non_kv, how = parse_size(non_kv_memory), f"--non-kv-memory {non_kv_memory}"
    rest = gpu.memory_bytes - non_kv
    if rest <= 0:
        raise KvpoolError(f"{how} leaves no memory on {gpu.name} ({format_bytes(gpu.memory_bytes)})")
    return Budget(int(rest * fraction), f"({gpu.key} - {how}) x {fraction:g}")


def check_parts(options: BudgetOptions, gpu: GpuSpec) -> None:
    """Refuse a part of one GPU's memory (weights, activations, ...) larger than the
    GPU: that is the flag's typo, not a short budget."""
    for part, text in options.parts:
        if size_or_zero(text) > gpu.memory_bytes:
            raise KvpoolError(
                f"{flag(part)} {text} is more than {gpu.key} holds ({format_bytes(gpu.memory_bytes)}); "
                "give one rank's share"
            )


def check_kv_memory(kv_bytes: int, text: str, gpu: str | None) -> None:
    """Refuse a --kv-memory no GPU holds: more than `gpu`'s memory, or without one
    more than the largest GPU kvpool knows (`kvpool gpus`). A budget per rank past
    the device is a typo, and a simulation would try to keep books for its pages."""
    device = presets.load_gpu(gpu) if gpu is not None else max(map(presets.load_gpu, presets.gpu_names()), key=_memory)
    if kv_bytes > device.memory_bytes:
        held = f"{device.key} holds {format_bytes(device.memory_bytes)}"
        what = held if gpu is not None else f"any GPU kvpool knows holds (the largest: {held})"
        raise KvpoolError(f"--kv-memory {text} is more than {what}; give one rank's KV budget")


def _memory(gpu: GpuSpec) -> int:
    return gpu.memory_bytes


def weights_source(spec: ModelSpec, model: str) -> str | Path:
    """Where the weights' headers of the model `spec` was loaded from are looked for."""
    origin = spec.source
    return origin.folder if origin is not None and origin.folder else model


def weights_facts(spec: ModelSpec, model: ModelOptions) -> tuple[int | None, int | None]:
    """(parameters, weight bytes per rank at the model's layout) of the model `spec`
    was loaded from, None where kvpool has no formula for its family."""
    from kvpool.models.weights import model_weights  # here: a given --kv-memory needs no weights

    try:
        weights = model_weights(spec.config, weights_source(spec, model.model))
    except (ParameterCountError, WeightSchemeError):
        return None, None
    return weights.parameters, weights.per_rank_bytes(model.parallel)


def weights_per_rank(spec: ModelSpec, model: ModelOptions, draft_len: int = 0) -> tuple[int, str]:
    """(weight bytes on the busiest rank, where they come from): the checkpoint's
    headers or the family's formula (models/weights.py), with the model's
    multi-token-prediction layers when they draft (`draft_len` > 0); for a bundled
    preset whose family has no formula, its published parameter count x bytes per
    parameter (data/model_params.json, each with its source) split evenly over tp x pp ranks."""
    from kvpool.models.weights import model_weights  # here: a given --kv-memory needs no weights

    config = spec.config
    mtp = int(config.get("num_nextn_predict_layers") or config.get("mtp_num_hidden_layers") or 0)
    try:
        weights = model_weights(config, weights_source(spec, model.model))
        if draft_len and mtp:
            weights = weights.with_draft_layers(mtp)
    except (ParameterCountError, WeightSchemeError):
        from kvpool.sim.steptime import params_table

        row = (
            params_table().get(spec.name.lower()) if spec.source is not None and spec.source.kind == "preset" else None
        )
        if row is None:
            raise
        ranks = model.tp * model.pp
        total = float(row["total_params"]) * float(row["weight_bytes_per_param"])
        return -(-int(total) // ranks), (
            f"published {float(row['total_params']) / 1e9:g}B parameters x {row['weight_bytes_per_param']} bytes, "
            f"split evenly over {ranks} ranks"
        )
    return weights.per_rank_bytes(model.parallel), weights.source


def activation_how(config: Mapping[str, Any], limits: ServingLimits, par: Parallel) -> str:
    """Which phase of vLLM's profiling step sets the activation estimate, in words."""
    tokens = limits.max_num_tokens or limits.max_seq_len
    rows = min(limits.max_batch_size, tokens)
    if sampler_peak(config, limits) > forward_peak(config, limits, par):
        return f"estimate: sampler of {rows} rows (> forward pass of {tokens} tokens)"
    return f"estimate: forward pass of {tokens} tokens (>= sampler of {rows} rows)"


def whole_gpu(
    options: BudgetOptions,
    model: ModelOptions,
    spec: ModelSpec,
    limits: ServingLimits,
    gpu_bytes: int,
    utilization: float,
    weights_bytes: int | None,
) -> MemoryBudget:
    """The per-rank breakdown of `--gpu` alone: each part from its flag, else estimated."""
    config, par = spec.config, model.parallel
    how: dict[str, str] = {}
    values: dict[str, int] = {}
    for part, text in options.parts:
        values[part], how[part] = size_or_zero(text), f"{flag(part)} {text}"
    if "weights_memory" not in values:
        if weights_bytes is not None:
            values["weights_memory"], how["weights_memory"] = weights_bytes, "--weights-bytes / tp"
        else:
            values["weights_memory"], how["weights_memory"] = weights_per_rank(spec, model, limits.max_draft_len)
    if "activation_memory" not in values:
        values["activation_memory"] = activation_bytes(config, limits, par)
        how["activation_memory"] = activation_how(config, limits, par)
    if "cuda_graph_memory" not in values:
        values["cuda_graph_memory"] = cuda_graph_bytes(config, limits, par)
        how["cuda_graph_memory"] = f"estimate: activations of batch {limits.largest_graph_batch}"
    if "reserved_memory" not in values:
        values["reserved_memory"], how["reserved_memory"] = DEFAULT_RESERVED, "none in vLLM's formula"
    return MemoryBudget(
        gpu_bytes,
        utilization,
        values["weights_memory"],
        values["activation_memory"],
        values["cuda_graph_memory"],
        values["reserved_memory"],
        {p.removesuffix("_memory"): h for p, h in how.items()},
    )
