"""The step-time model: how long one scheduler iteration takes on one GPU.

Everything the simulator assumes about speed is in this file.

    time = max(flops / peak_flops, bytes / hbm_bandwidth) + overhead

- **flops** = 2 x active parameters x tokens computed (every token passes
  through the dense layers and its routed experts), plus attention:
  4 x query heads x head dim per (query, key) pair per layer (QK^T and PV, one
  multiply-add = 2 FLOPs each). A decode row with history h has h + 1 keys per
  query in a full group, min(h + 1, W) in a sliding group, (h mod C) + 1 in a
  chunked group, (h + 1) / r in a compressed group; a prefill chunk is causal.
- **bytes** = weights read once per step + KV read + KV written. Weights: a
  dense model reads all its parameters. A MoE model reads its dense part
  (active minus the routed experts a token uses) plus the distinct experts the
  step's tokens touch: with E experts, k per token and T tokens, the expected
  share touched is 1 - (1 - k/E)^T (k/E per token, drawn independently). For one
  token that is the active parameters; for large batches all of them. KV: per
  group, each key position read costs the group's `row_bytes` (all its layers);
  each new position is written once; a `state` group reads and writes its
  `state_bytes` per request.
- **peak_flops** = the GPU's dense BF16 figure, FP8 when the checkpoint stores
  one byte per parameter or less; **hbm_bandwidth**: `kvpool.presets.load_gpu`
  (data/gpus.json, with sources). Both are peaks: the model is a roofline, so
  absolute times are optimistic; comparisons between plans on the same GPU are
  what it is for.
- **overhead**: a step that runs eagerly launches every kernel from the CPU:
  `LAUNCH_S` per kernel x (`KERNELS_PER_LAYER` (+ `MOE_KERNELS_PER_LAYER`) per
  layer + `KERNELS_PER_STEP`). A CUDA-graph step pays one replay, `REPLAY_S`.
  Sources: one cudaLaunchKernel costs about 5 us of CPU time and one eager
  PyTorch op 5-20 us (learnaivisually.com "CUDA Graphs for LLM decode";
  transcendence2006.site "CUDA graphs and inference optimization"). Check:
  Llama-3.1-8B on H100 decodes in 8.4 ms eager vs 5.1 ms with a CUDA graph
  (cloudai.pt, "CUDA Graphs + torch.compile: 1.65x LLM decode speedup"): a
  3.3 ms gap; 32 layers x 10 kernels x 10 us = 3.2 ms.
- Weights: `data/model_params.json` (parameter counts from model cards, each
  with its source) or `weights_bytes` / `active_params` given by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from kvpool.errors import KvpoolError
from kvpool.presets import DATA, GpuSpec
from kvpool.sched import Step
from kvpool.spec import LayerGroup, ModelSpec
from kvpool.spec.families import head_dim, split_heads

LAUNCH_S = 10e-6  # one eager op: Python dispatch + cudaLaunchKernel
KERNELS_PER_LAYER = 10  # norms, QKV, RoPE, attention, O, residuals, gate/up, act, down
MOE_KERNELS_PER_LAYER = 4  # router, top-k, permute, un-permute
KERNELS_PER_STEP = 6  # embedding, final norm, LM head, sampling, input copies
REPLAY_S = 20e-6  # one cudaGraphLaunch of a whole decode step


@dataclass(frozen=True)
class Weights:
    """What the weights cost: parameter counts, bytes per parameter, experts."""

    total_params: float
    active_params: float
    bytes_per_param: float = 2.0
    num_experts: int | None = None
    experts_per_token: int | None = None
    source: str = ""


@cache
def params_table() -> dict[str, Any]:
    """Parameter counts of the bundled models (data/model_params.json), by lower-cased name."""
    table: dict[str, Any] = json.loads((DATA / "model_params.json").read_text())["models"]
    return table


def load_weights(model: str, *, weights_bytes: float | None = None, active_params: float | None = None) -> Weights:
    """Weight facts for a bundled model, or from `weights_bytes` (a dense model of
    that many bytes at 2 bytes per parameter unless the table knows better).
    `active_params` overrides the active count. Raises KvpoolError when neither
    the table nor the arguments say how large the model is."""
    row = params_table().get(model.lower())
    if row is None and weights_bytes is None:
        raise KvpoolError(
            f"no parameter count for model {model!r}; pass --weights-bytes (e.g. 16GB) "
            f"[and --active-params for MoE]; known: {', '.join(sorted(params_table()))}"
        )
    if row is not None:
        w = Weights(
            float(row["total_params"]),
            float(row["active_params"]),
            float(row["weight_bytes_per_param"]),
            row.get("num_experts"),
            row.get("experts_per_token"),
            str(row["source"]),
        )
    else:
        assert weights_bytes is not None
        w = Weights(weights_bytes / 2.0, weights_bytes / 2.0, source="--weights-bytes")
    if weights_bytes is not None:
        w = Weights(
            weights_bytes / w.bytes_per_param,
            w.active_params * weights_bytes / (w.total_params * w.bytes_per_param),
            w.bytes_per_param,
            w.num_experts,
            w.experts_per_token,
            "--weights-bytes",
        )
    if active_params is not None:
        if active_params <= 0 or active_params > w.total_params:
            raise KvpoolError(f"active params {active_params:g} must be in (0, {w.total_params:g}]")
        w = Weights(w.total_params, active_params, w.bytes_per_param, w.num_experts, w.experts_per_token, w.source)
    return w


@dataclass(frozen=True)
class GroupCost:
    """Per pool group: FLOPs per (query, key) pair, bytes per key row; what a
    step reads and writes follows the group's kind rule (`spec.kinds`)."""

    group: LayerGroup
    flops_per_pair: float
    row_bytes: float
    state_bytes: float

    @property
    def name(self) -> str:
        return self.group.name


def _attention_dims(spec: ModelSpec, group: LayerGroup) -> tuple[int, int]:
    """(query heads per rank, head dim) of a group's attention."""
    c = spec.config
    heads = split_heads(int(c.get("num_attention_heads") or 1), spec.tp_size)
    if spec.family in ("deepseek_v3", "deepseek_v32"):
        # absorbed MLA: each head attends over the latent (kv_lora_rank + rope) row
        return heads, int(c.get("kv_lora_rank", 512)) + int(c.get("qk_rope_head_dim", 64))
    if group.kind == "full" and c.get("global_head_dim"):
        return heads, int(c["global_head_dim"])
    return heads, head_dim(c)


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per step for one model on one GPU (see the module docstring)."""

    gpu: GpuSpec
    weights: Weights
    groups: tuple[GroupCost, ...]
    num_layers: int
    launch_s: float = LAUNCH_S
    replay_s: float = REPLAY_S

    @classmethod
    def build(cls, spec: ModelSpec, gpu: GpuSpec, weights: Weights) -> StepTimeModel:
        groups = []
        for g in spec.groups:
            heads, dim = _attention_dims(spec, g)
            pair = 0.0 if g.rule.per_request else 4.0 * heads * dim * len(g.layers)
            groups.append(GroupCost(g, pair, float(g.row_bytes), float(g.state_bytes)))
        return cls(gpu, weights, tuple(groups), spec.num_layers)

    @property
    def peak_flops(self) -> float:
        if self.weights.bytes_per_param <= 1 and self.gpu.fp8_flops:
            return self.gpu.fp8_flops
        return self.gpu.bf16_flops

    @property
    def eager_overhead_s(self) -> float:
        per_layer = KERNELS_PER_LAYER + (MOE_KERNELS_PER_LAYER if self.weights.num_experts else 0)
        return self.launch_s * (per_layer * self.num_layers + KERNELS_PER_STEP)

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes one step of `tokens` tokens reads."""
        w = self.weights
        if not w.num_experts or not w.experts_per_token or w.num_experts <= w.experts_per_token:
            return w.total_params * w.bytes_per_param
        e, k = w.num_experts, w.experts_per_token
        per_expert = (w.total_params - w.active_params) / (e - k)
        dense = w.active_params - k * per_expert
        touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 1))
        return (dense + touched * per_expert) * w.bytes_per_param

    def keys(self, g: GroupCost, history: int) -> float:
        """Key rows a query at position `history` reads in group `g`."""
        return float(g.group.rule.keys_read(g.group, history))

    def chunk_pairs(self, g: GroupCost, start: int, n: int) -> float:
        """(query, key) pairs of a causal prefill chunk of `n` tokens after `start`."""
        return g.group.rule.prefill_pairs(g.group, start, n)

    @staticmethod
    def written(g: GroupCost, tokens: float) -> float:
        """Rows a step of `tokens` tokens writes in `g`."""
        return tokens / g.group.rule.rows_per_position(g.group)

    def step_time(self, step: Step) -> float:
        """Seconds that `step` takes (no side effects)."""
        return self.time(
            [(s.num_computed, k) for s, k in step.decodes],
            [(start, n) for _, start, n in step.prefills],
            graph=step.graph,
            padded_batch=step.padded_batch_size,
        )

    def decode_run_times(
        self, histories: Seq[int], steps: int, *, graph: bool = False, padded_batch: int | None = None
    ) -> npt.NDArray[np.float64]:
        """Seconds of each of `steps` decode-only steps in a row (no drafts), the
        rows starting at `histories` and each step adding one position: the
        same arithmetic as `time`, vectorised over the steps."""
        h = np.asarray(histories, dtype=np.float64)[None, :] + np.arange(steps, dtype=np.float64)[:, None]
        rows = h.shape[1]
        tokens = padded_batch if graph and padded_batch else rows
        flops = np.full(steps, 2.0 * self.weights.active_params * tokens)
        kv_bytes = np.zeros(steps)
        for g in self.groups:
            if g.group.rule.per_request:  # the state is read and written once per row
                kv_bytes += 2.0 * g.state_bytes * rows
                continue
            keys = g.group.rule.keys_read(g.group, h).sum(axis=1)
            flops += g.flops_per_pair * keys
            kv_bytes += g.row_bytes * (keys + self.written(g, tokens))
        bytes_moved = self.weight_bytes(tokens) + kv_bytes
        roofline = np.maximum(flops / self.peak_flops, bytes_moved / self.gpu.hbm_bandwidth_bytes_per_s)
        result: npt.NDArray[np.float64] = roofline + (self.replay_s if graph else self.eager_overhead_s)
        return result

    def time(
        self,
        decodes: Seq[tuple[int, int]],
        prefills: Seq[tuple[int, int]],
        *,
        graph: bool = False,
        padded_batch: int | None = None,
    ) -> float:
        """Seconds for a step of decode rows (history, drafts) and prefill chunks
        (start, tokens). A graph step computes its padded rows too."""
        rows = len(decodes)
        tokens = sum(1 + k for _, k in decodes) + sum(n for _, n in prefills)
        if graph and padded_batch:
            tokens += (padded_batch - rows) * (1 + max((k for _, k in decodes), default=0))
        flops = 2.0 * self.weights.active_params * tokens
        kv_bytes = 0.0
        for g in self.groups:
            if g.group.rule.per_request:
                kv_bytes += 2.0 * g.state_bytes * (rows + len(prefills))
                continue
            pairs = 0.0
            read = 0.0
            for h, k in decodes:
                keys = self.keys(g, h + k)
                pairs += keys * (1 + k)
                read += keys
            for start, n in prefills:
                pairs += self.chunk_pairs(g, start, n)
                read += self.keys(g, start + n - 1)
            flops += g.flops_per_pair * pairs
            kv_bytes += g.row_bytes * (read + self.written(g, tokens))
        bytes_moved = self.weight_bytes(tokens) + kv_bytes
        roofline = max(flops / self.peak_flops, bytes_moved / self.gpu.hbm_bandwidth_bytes_per_s)
        return roofline + (self.replay_s if graph else self.eager_overhead_s)
