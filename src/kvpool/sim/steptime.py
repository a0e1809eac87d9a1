"""The step-time model: how long one scheduler iteration takes on one rank.

Everything the simulator assumes about speed is in this file, `sim/kernels.py`
(what each kind of GPU work costs) and `sim/calibration.py` (the constants,
fitted on measured kernel timings). A step runs its kernels one after the
other, so its GPU time is the **sum** of its parts:

    gpu = matmuls (dense + lm_head) + routed experts + attention (per group)
          + elementwise + all-reduce (tp > 1)
    step = gpu + step_floor + row_s x requests                (CUDA graph)
    step = max(gpu, launches x launch_s) + step_floor + ...   (eager: the CPU
           launching kernels one by one is the bound when the GPU is faster)

- **matmuls**: every token passes every dense multiply of its rank
  (`sim/matmuls.py`, from the checkpoint's own tensor list); the rows that
  sample (decode rows and drafts, one per prefill chunk) pass the lm_head.
- **routed experts**: per MoE layer, the experts the step's T tokens touch,
  E (1 - (1 - k/E)^T) of them, each streaming its weights and computing whole
  tiles of the tokens it got.
- **attention**, per pool group, by its kind rule (`spec.kinds`): a decode row
  with history h reads `keys_read(h)` key rows (full: h + 1; sliding:
  min(h + 1, W); chunked; compressed) of `row_bytes` each (all the group's
  layers), a prefill chunk computes its causal (query, key) pairs at
  4 x heads x head_dim FLOPs each; new rows are written once; a `state` group
  reads and writes its `state_bytes` per request.
- **FLOP peaks**: matmuls at the BF16 peak, FP8 for 1-byte weights; 4-bit
  weights (MXFP4, ~0.53 bytes/param) run as W4A16 (BF16 math), on Hopper and
  Ampere with the kernel vLLM picks (`sim/fp4_experts.py`: Marlin's blocks at
  mma.sync's rate); a checkpoint that converts only its experts keeps the
  rest at 2 bytes (`expert_storage`). Attention math at the BF16 peak; a
  prefill vLLM runs on its Triton backend (attention sinks on Ampere/Ada)
  no faster than the L2 feeds its tiles (`sim/triton_prefill.py`).

`calibration="roofline"` keeps the idealised model this simulator had before
calibration, for comparison: max(all FLOPs / peak, all bytes / bandwidth) +
launch or replay overhead, one roofline over the whole step.
- Weights: `data/model_params.json` (parameter counts from model cards, each
  with its source) or `weights_bytes` / `active_params` given by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from kvpool.errors import KvpoolError
from kvpool.models.weight_dtype import UNCONVERTED_BYTES, WeightSchemeError, matrix_bytes, weight_scheme
from kvpool.presets import DATA, GpuSpec
from kvpool.sched import Step
from kvpool.sim.calibration import for_gpu
from kvpool.sim.fp4_experts import fp4_experts
from kvpool.sim.kernels import Calibration, Kernels, maximum
from kvpool.sim.matmuls import Shapes, model_shapes
from kvpool.sim.triton_prefill import triton_prefill
from kvpool.spec import LayerGroup, ModelSpec
from kvpool.spec.families import head_dim, split_heads

# The roofline's overheads (calibration="roofline"). One cudaLaunchKernel costs
# about 5 us of CPU time and one eager PyTorch op 5-20 us (learnaivisually.com
# "CUDA Graphs for LLM decode"); Llama-3.1-8B on H100 decodes in 8.4 ms eager vs
# 5.1 ms with a CUDA graph (cloudai.pt, "CUDA Graphs + torch.compile: 1.65x LLM
# decode speedup"): 32 layers x 10 kernels x 10 us = 3.2 ms of the 3.3 ms gap.
LAUNCH_S = 10e-6  # one eager op: Python dispatch + cudaLaunchKernel
KERNELS_PER_LAYER = 10  # norms, QKV, RoPE, attention, O, residuals, gate/up, act, down
MOE_KERNELS_PER_LAYER = 4  # router, top-k, permute, un-permute
KERNELS_PER_STEP = 6  # embedding, final norm, LM head, sampling, input copies
REPLAY_S = 20e-6  # one cudaGraphLaunch of a whole decode step
# The most (tokens, sampled rows) pairs a model remembers (`_token_parts`): steps
# repeat a few thousand in any run; past it the memo starts again.
TOKEN_MEMO_SIZE = 1 << 16


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


class StepCost(NamedTuple):
    """Seconds of one step by part (`StepTimeModel.cost`); `total` is the step.
    Floats, or arrays over a run of decode steps."""

    matmul: Any
    experts: Any
    attention: Any
    elementwise: Any
    allreduce: Any
    overhead: Any
    total: Any


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds per step for one model on one rank (see the module docstring).
    `kernels` None is the roofline model."""

    gpu: GpuSpec
    weights: Weights
    groups: tuple[GroupCost, ...]
    num_layers: int
    shapes: Shapes
    kernels: Kernels | None
    tp: int = 1
    launch_s: float = LAUNCH_S
    replay_s: float = REPLAY_S
    # bytes per parameter of the dense matmuls and of the routed experts, where the checkpoint converts only
    # its experts (MXFP4: `expert_storage`); None: `weights.bytes_per_param` for both
    storage: tuple[float, float] | None = None

    @classmethod
    def build(
        cls, spec: ModelSpec, gpu: GpuSpec, weights: Weights, calibration: Calibration | str | None = None
    ) -> StepTimeModel:
        """The model of `spec` (one rank: `weights` already per rank) on `gpu`.
        `calibration`: None for the shipped profile of `gpu`
        (`calibration.for_gpu`), a `Calibration`, or "roofline"."""
        groups = []
        for g in spec.groups:
            heads, dim = _attention_dims(spec, g)
            pair = 0.0 if g.rule.per_request else 4.0 * heads * dim * len(g.layers)
            groups.append(GroupCost(g, pair, float(g.row_bytes), float(g.state_bytes)))
        tp = max(spec.tp_size, 1)
        shapes = model_shapes(
            spec.config,
            tp,
            total_params=weights.total_params,
            active_params=weights.active_params,
            experts=weights.num_experts,
            top_k=weights.experts_per_token,
        )
        if calibration == "roofline":
            kernels = None
        else:
            if calibration is None:
                cal = for_gpu(gpu)
            elif isinstance(calibration, Calibration):
                cal = calibration
            else:
                raise KvpoolError(f"calibration must be a Calibration, None or 'roofline', not {calibration!r}")
            matmul_peak = gpu.fp8_flops if weights.bytes_per_param == 1 and gpu.fp8_flops else gpu.bf16_flops
            kernels = Kernels(
                cal,
                gpu.hbm_bandwidth_bytes_per_s,
                matmul_peak,
                gpu.bf16_flops,
                fp4_experts(gpu),
                triton_prefill(gpu, spec),
            )
        storage = expert_storage(spec.config, shapes) if kernels is not None else None
        return cls(gpu, weights, tuple(groups), spec.num_layers, shapes, kernels, tp, storage=storage)

    @property
    def calibration(self) -> str:
        """Which constants price the steps: a profile name, or "roofline"."""
        return "roofline" if self.kernels is None else self.kernels.cal.name

    @property
    def peak_flops(self) -> float:
        if self.weights.bytes_per_param <= 1 and self.gpu.fp8_flops:
            return self.gpu.fp8_flops
        return self.gpu.bf16_flops

    @property
    def eager_overhead_s(self) -> float:
        return self.launch_s * self.eager_launches

    @cached_property
    def eager_launches(self) -> int:
        # (cached: every eager step asks; in the instance's __dict__, as `_token_memo`)
        per_layer = KERNELS_PER_LAYER + (MOE_KERNELS_PER_LAYER if self.weights.num_experts else 0)
        return per_layer * self.num_layers + KERNELS_PER_STEP

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes one step of `tokens` tokens reads (roofline model)."""
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
        histories = [s.num_computed for s, _ in step.decodes]
        drafts = [k for _, k in step.decodes]
        prefills = [(start, n) for _, start, n in step.prefills]
        return float(self._cost(histories, drafts, prefills, step.graph, step.padded_batch_size).total)

    def decode_run_times(
        self, histories: Seq[int], steps: int, *, graph: bool = False, padded_batch: int | None = None
    ) -> npt.NDArray[np.float64]:
        """Seconds of each of `steps` decode-only steps in a row (no drafts), the
        rows starting at `histories` and each step adding one position: the
        same arithmetic as `time`, vectorised over the steps."""
        rows = len(histories)
        tokens = float(padded_batch if graph and padded_batch else rows)
        keys = [
            np.zeros(steps) if g.group.rule.per_request else _run_keys(g.group, histories, steps) for g in self.groups
        ]
        decode = [(k, k) for k in keys]  # (pairs, rows read) per group
        total = self._parts(tokens, tokens, rows, decode, [0.0] * len(keys), graph).total
        return np.full(steps, total) if type(total) is float else total  # a float when no group reads keys

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
        return float(self.cost(decodes, prefills, graph=graph, padded_batch=padded_batch).total)

    def cost(
        self,
        decodes: Seq[tuple[int, int]],
        prefills: Seq[tuple[int, int]],
        *,
        graph: bool = False,
        padded_batch: int | None = None,
    ) -> StepCost:
        """`time`, by part."""
        return self._cost([h for h, _ in decodes], [k for _, k in decodes], prefills, graph, padded_batch)

    def _cost(
        self,
        histories: list[int],
        drafts: list[int],
        prefills: Seq[tuple[int, int]],
        graph: bool,
        padded_batch: int | None,
    ) -> StepCost:
        """`cost` of decode rows given as their histories and drafts."""
        rows = len(histories)
        most, drafted = max(drafts, default=0), any(drafts)
        decode_tokens = rows + sum(drafts)
        if graph and padded_batch:
            decode_tokens += (padded_batch - rows) * (1 + most)
        tokens = decode_tokens + sum([n for _, n in prefills])
        # the position of each decode row's last query
        ends = [h + k for h, k in zip(histories, drafts, strict=True)] if drafted else histories
        decode, prefill = [], []
        for g in self.groups:
            group = g.group
            rule = group.rule
            if rule.per_request:
                decode.append((0.0, 0.0))
                prefill.append(0.0)
                continue
            keys_read = rule.keys_read
            if drafted:
                pairs = read = 0.0
                for end, k in zip(ends, drafts, strict=True):
                    keys = keys_read(group, end)
                    pairs += keys * (1 + k)
                    read += keys
            else:  # no drafts: a row's one query reads its keys once (the rows' sum, as the loop adds it)
                pairs = read = rule.keys_read_sum(group, ends)
            chunk = 0.0
            for start, n in prefills:
                chunk += rule.prefill_pairs(group, start, n)
                read += keys_read(group, start + n - 1)
            decode.append((pairs, read))
            prefill.append(chunk)
        return self._parts(
            float(tokens), float(decode_tokens + len(prefills)), rows + len(prefills), decode, prefill, graph
        )

    def _roofline(
        self, tokens: float, requests: int, decode: list[tuple[Any, Any]], prefill: list[Any], graph: bool
    ) -> StepCost:
        """The pre-calibration model: one max(FLOPs / peak, bytes / bandwidth)
        over the whole step, plus launch or replay overhead."""
        flops: Any = 2.0 * self.weights.active_params * tokens
        bytes_moved: Any = self.weight_bytes(int(tokens))
        for g, (pairs, read), chunk in zip(self.groups, decode, prefill, strict=True):
            if g.group.rule.per_request:
                bytes_moved = bytes_moved + 2.0 * g.state_bytes * requests
                continue
            bytes_moved = bytes_moved + g.row_bytes * (read + self.written(g, tokens))
            flops = flops + g.flops_per_pair * (pairs + chunk)
        roof = np.maximum(flops / self.peak_flops, bytes_moved / self.gpu.hbm_bandwidth_bytes_per_s)
        over = self.replay_s if graph else self.eager_overhead_s
        return StepCost(roof, 0.0, 0.0, 0.0, 0.0, over, roof + over)

    def _parts(
        self,
        tokens: float,
        logits: float,
        requests: int,
        decode: list[tuple[Any, Any]],
        prefill: list[Any],
        graph: bool,
    ) -> StepCost:
        """Price a step from its token count, sampling rows, requests and, per
        group, (decode pairs, key rows read) and prefill pairs; the per-group
        figures may be arrays over a run of steps (`decode_run_times`)."""
        k = self.kernels
        if k is None:
            return self._roofline(tokens, requests, decode, prefill, graph)
        matmul, experts, elementwise, allreduce = self._token_parts(tokens, logits)
        attention: Any = 0.0
        for g, (pairs, read), chunk in zip(self.groups, decode, prefill, strict=True):
            layers = len(g.group.layers)
            if g.group.rule.per_request:
                attention = attention + k.decode_attention(2.0 * g.state_bytes * requests, 0.0, layers)
                continue
            if _some(pairs):
                written = g.row_bytes * (read + self.written(g, tokens))
                attention = attention + k.decode_attention(written, g.flops_per_pair * pairs, layers)
            if _some(chunk):
                attention = attention + k.prefill_attention(g.flops_per_pair * chunk, layers)
        gpu = matmul + experts + attention + elementwise + allreduce
        cal = k.cal
        floor = cal.step_floor_s + cal.row_s * requests
        busy = gpu if graph else maximum(gpu, cal.launch_s * self.eager_launches)
        return StepCost(matmul, experts, attention, elementwise, allreduce, busy - gpu + floor, busy + floor)

    def _token_parts(self, tokens: float, logits: float) -> tuple[Any, Any, Any, Any]:
        """(matmul, experts, elementwise, all-reduce): the parts of `_parts` that
        depend on the step's tokens and sampled rows alone, remembered per pair
        (a pure function of them; most steps repeat a pair: every decode batch of
        one graph size)."""
        key = (tokens, logits)
        known = self._token_memo.get(key)
        if known is not None:
            return known
        k, sh = self.kernels, self.shapes
        assert k is not None  # the calibrated model's
        bpp, expert_bpp = self.storage or (self.weights.bytes_per_param, self.weights.bytes_per_param)
        matmul: Any = sum(k.matmul(tokens, g, bpp) for g in sh.dense) + k.matmul(logits, sh.lm_head, bpp)
        experts: Any = 0.0
        if sh.moe_layers and sh.expert:
            touched = sh.touched_experts(tokens)
            experts = sh.moe_layers * k.experts(tokens, sh.expert, touched, expert_bpp, sh.top_k, sh.experts)
        elementwise = k.elementwise(tokens, sh.hidden, self.num_layers)
        allreduce = k.allreduce(tokens, sh.hidden, self.tp, 2 * self.num_layers)
        if len(self._token_memo) >= TOKEN_MEMO_SIZE:
            self._token_memo.clear()
        known = self._token_memo[key] = (matmul, experts, elementwise, allreduce)
        return known

    @cached_property
    def _token_memo(self) -> dict[tuple[float, float], tuple[Any, Any, Any, Any]]:
        # in the instance's __dict__, not a field: equality, hashing, fields() and replace() ignore it
        return {}


def _run_keys(group: LayerGroup, histories: Seq[int], steps: int) -> npt.NDArray[np.float64]:
    """Per step of a run of decode steps (`decode_run_times`), the key rows
    the rows read in `group`: `keys_read` at h + t summed over the rows at
    histories h, step t. Where the rule's `keys_read` is h + 1 (full
    attention) each step reads `rows` more than the one before: the ints in
    closed form, the same floats as NumPy's sums of the grid where
    `KindRule.exact_keys_sum` says floats hold every sum exactly."""
    rule, rows = group.rule, len(histories)
    first = rule.exact_keys_sum(histories, steps)
    if first is not None:
        return np.arange(first, first + rows * steps, rows, dtype=np.int64).astype(np.float64)
    h = np.asarray(histories, dtype=np.float64)[None, :] + np.arange(steps, dtype=np.float64)[:, None]
    keys: npt.NDArray[np.float64] = rule.keys_read(group, h).sum(axis=1)
    return keys


def _some(x: Any) -> bool:
    """Whether a figure (a float, or an array over a run of steps) is not all zero."""
    # (`count_nonzero`: the same answer as `any()` without its Python-level wrapper)
    return bool(x) if type(x) is float else bool(np.count_nonzero(x))


def expert_storage(config: Any, shapes: Shapes) -> tuple[float, float] | None:
    """(dense, expert) bytes per parameter where the checkpoint converts only
    its routed experts (MXFP4, gpt-oss: transformers' Mxfp4HfQuantizer replaces
    the experts; vLLM's Mxfp4Config gives every other linear layer
    UnquantizedLinearMethod): the rest stays bf16. None for other schemes,
    whose weights cost `Weights.bytes_per_param` throughout."""
    try:
        scheme = weight_scheme(config)
    except WeightSchemeError:
        return None
    if not scheme.experts_only or not shapes.expert:
        return None
    g = shapes.expert[0]
    return float(UNCONVERTED_BYTES), matrix_bytes(scheme, g.n, g.k, convertible=True) / (g.k * g.n)
