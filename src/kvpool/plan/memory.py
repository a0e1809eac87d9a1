"""The whole GPU's memory, one rank at a time: what is left for the KV cache.

    kv = gpu_memory x utilization - weights - activations - cuda_graphs - reserved

- **utilization**: the share of the device's memory the engine may use, 0.9 by
  default: vLLM's `gpu_memory_utilization` default and meaning (a fraction of the
  device's total memory, vllm/config/cache.py). The device's memory is what it
  reports (`kvpool gpus`).
- **weights**: the busiest rank's share (models/weights.py: safetensors headers or
  the parameter formula, split by tp / pp / ep / dp).
- **activations** (estimate): the peak of vLLM's profiling step (`profile_run`,
  vllm/v1/worker/gpu_model_runner.py, 0.26 to 0.33 alike), the larger of its two phases:
  - the dummy forward pass at `max_num_batched_tokens` N (max_seq_len without a token
    budget): one layer's peak per token, in 2-byte activations: the residual stream and
    its normalised copy (2H), the QKV output ((n + 2k) d / (tp/dp); MLA: n (2 nope + rope
    + v) / (tp/dp) + kv_lora + rope), and the gated MLP's gate/up output and activation
    (3 I' / tp, I' = intermediate_size, or for MoE top_k x moe_intermediate_size plus the
    shared experts, plus top_k x H for the routed outputs before they are combined):
    `N x 2 x (2H + qkv + 3 I'/tp [+ top_k H])`;
  - then the dummy sampler (`_dummy_sampler_run`) on R = min(max_num_seqs, N) rows, run
    after the forward pass has freed its activations but while its output hidden states
    (N x H) are still held: the R rows picked from them and their random stand-in
    (2 R x H), and 14 bytes per row and vocabulary entry: the bf16 logits, their float32
    copy, the probabilities and the exponential noise of the second, PyTorch-native
    sampling pass that warms the per-request-generator path. Measured by running vLLM's
    own `_dummy_sampler_run` on CPU (tests/test_vllm_profile_peak.py); the Triton
    top-k/top-p kernel works on the logits in place (its cached min(SMs, R) x V float32
    buffer is not counted).
  vLLM takes the torch allocator's peak over the whole step, so the two phases' larger
  counts, not their sum.
- **CUDA graphs** (estimate): vLLM (0.21 and later, `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`
  on by default) takes its graphs out of the budget before the KV cache
  (`profile_cudagraph_memory`): per graph mode it captures the two largest sizes, counts
  the first capture whole and the second once per remaining size, and adds the modes'
  per-size parts to the largest first capture. That is a measurement on the GPU; kvpool
  counts only the pool the graphs share (vLLM captures them largest first into one
  `graph_pool_handle`, PyTorch "CUDA Graphs" docs: graphs that share a pool reuse its
  memory): the per-token activation above x the largest captured batch size. The
  graphs' own per-size memory (kernel parameters, piecewise pieces) is not counted;
  pass --cuda-graph-memory with vLLM's "Estimated CUDA graph memory" line for a measured figure.
- **reserved**: `DEFAULT_RESERVED` = 0, as in vLLM's formula
  (`gpu_worker.determine_available_memory`: requested memory - weights - profiling
  peak - non-torch growth - CUDA-graph estimate): the CUDA context and the cuBLAS
  warm-up come before vLLM's baseline snapshot (`init_snapshot`), so they come out of
  the (1 - utilization) share, not the budget. `--reserved-memory` sets an allowance,
  e.g. for vLLM's non-torch growth during profiling (NCCL buffers, loaded kernels),
  which vLLM measures and kvpool does not model. docs/engines.md tabulates each term's source.

Each estimate can be replaced by a given figure; a budget that comes out at zero
or below is refused by name with what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpool.errors import KvpoolError
from kvpool.plan.limits import ServingLimits
from kvpool.units import format_bytes

if TYPE_CHECKING:  # annotations only: `kvpool simulate` reads no checkpoint's weights
    from kvpool.models.weights import Parallel

DEFAULT_UTILIZATION = 0.9
DEFAULT_RESERVED = 0  # vLLM's formula has no reserve (module docstring)
ACTIVATION_BYTES = 2  # bf16 / fp16 activations
# vLLM's dummy sampler per row and vocabulary entry: bf16 logits (2) + their float32 copy, the
# probabilities and the exponential noise (4 each); tests/test_vllm_profile_peak.py runs vLLM's own
SAMPLER_BYTES = 2 + 3 * 4


def _field(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not value:
        raise KvpoolError(f"config is missing field {key!r} for the activation estimate; give --activation-memory")
    return int(value)


def _qkv_width(config: Mapping[str, Any], attn_tp: int) -> int:
    """One rank's query, key and value columns per token (MLA: the latent and the rope part whole)."""
    h, n = _field(config, "hidden_size"), _field(config, "num_attention_heads")
    if config.get("kv_lora_rank"):
        nope, rope, v = (_field(config, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        return -(-n * (2 * nope + rope + v) // attn_tp) + _field(config, "kv_lora_rank") + rope
    k = int(config.get("num_key_value_heads") or n)
    d = int(config.get("head_dim") or h // n)
    return -(-(n + 2 * k) * d // attn_tp)


def _routed_experts(config: Mapping[str, Any]) -> int:
    """The routed experts, under each family's field name (0: a dense model)."""
    return int(config.get("n_routed_experts") or config.get("num_local_experts") or config.get("num_experts") or 0)


def _mlp_width(config: Mapping[str, Any], h: int) -> tuple[int, int]:
    """(the MLP's widest intermediate per token, the routed experts' outputs per token):
    a MoE layer runs top-k experts and its shared ones."""
    top_k = int(config.get("num_experts_per_tok") or config.get("experts_per_token") or 0)
    dense = int(config.get("intermediate_size") or 0)
    if not (_routed_experts(config) and top_k):
        return dense, 0
    moe = int(config.get("moe_intermediate_size") or dense)
    shared = int(config.get("n_shared_experts") or 0) * moe + int(config.get("shared_expert_intermediate_size") or 0)
    return max(dense, top_k * moe + shared), top_k * h


def activation_per_token(config: Mapping[str, Any], par: Parallel) -> int:
    """Bytes of one token's peak per-layer activations on one rank (module docstring)."""
    h = _field(config, "hidden_size")
    qkv = _qkv_width(config, par.tp // par.dp)
    mlp, routed_out = _mlp_width(config, h)
    if not mlp:
        raise KvpoolError("config is missing field 'intermediate_size' for the activation estimate")
    return ACTIVATION_BYTES * (2 * h + qkv + -(-3 * mlp // par.tp) + routed_out)


def forward_peak(config: Mapping[str, Any], limits: ServingLimits, par: Parallel) -> int:
    """The dummy forward pass of the largest step (module docstring)."""
    return (limits.max_num_tokens or limits.max_seq_len) * activation_per_token(config, par)


def sampler_peak(config: Mapping[str, Any], limits: ServingLimits) -> int:
    """The dummy sampler's peak with the forward pass's output still held (module docstring)."""
    tokens = limits.max_num_tokens or limits.max_seq_len
    rows = min(limits.max_batch_size, tokens)
    hidden = ACTIVATION_BYTES * (tokens + 2 * rows) * _field(config, "hidden_size")
    return hidden + SAMPLER_BYTES * rows * _field(config, "vocab_size")


def activation_bytes(config: Mapping[str, Any], limits: ServingLimits, par: Parallel) -> int:
    """The profiling step's peak: the larger of its forward pass and its sampler (module docstring)."""
    return max(forward_peak(config, limits, par), sampler_peak(config, limits))


def cuda_graph_bytes(config: Mapping[str, Any], limits: ServingLimits, par: Parallel) -> int:
    """The shared CUDA-graph pool: the largest captured batch's activations."""
    return limits.largest_graph_batch * activation_per_token(config, par)


@dataclass(frozen=True)
class MemoryBudget:
    """One rank's memory, in bytes, and where each figure came from (`how`:
    part -> 'estimate', 'safetensors headers', a flag, ...)."""

    gpu_bytes: int
    utilization: float
    weights_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int
    reserved_bytes: int
    how: Mapping[str, str]

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_bytes * self.utilization)

    @property
    def kv_bytes(self) -> int:
        """What is left for the KV cache (negative when the rest does not fit)."""
        used = self.weights_bytes + self.activation_bytes + self.cuda_graph_bytes + self.reserved_bytes
        return self.usable_bytes - used

    def to_json(self) -> dict[str, Any]:
        keys = ("gpu_bytes", "utilization", "weights_bytes", "activation_bytes", "cuda_graph_bytes", "reserved_bytes")
        return {
            **{k: getattr(self, k) for k in keys},
            "kv_bytes": self.kv_bytes,
            "per_rank": True,
            "how": dict(self.how),
        }

    def check(self, gpu: str, par: Parallel) -> None:
        """Raise KvpoolError naming the shortfall and what to change when no KV memory is left."""
        if self.kv_bytes > 0:
            return
        biggest = max(
            ("weights", self.weights_bytes),
            ("activations", self.activation_bytes),
            ("CUDA graphs", self.cuda_graph_bytes),
            key=lambda kv: kv[1],
        )[0]
        hint = {
            "weights": f"more --tp (now {par.tp}) or a quantized checkpoint",
            "activations": "a smaller --max-num-tokens or --max-batch-size (or give --activation-memory)",
            "CUDA graphs": "smaller --cuda-graph-batch-sizes (or give --cuda-graph-memory)",
        }[biggest]
        raise KvpoolError(
            f"no memory left for the KV cache on {gpu}: weights {format_bytes(self.weights_bytes)} + activations "
            f"{format_bytes(self.activation_bytes)} + CUDA graphs {format_bytes(self.cuda_graph_bytes)} + reserved "
            f"{format_bytes(self.reserved_bytes)} exceed {self.utilization:g} x {format_bytes(self.gpu_bytes)} by "
            f"{format_bytes(-self.kv_bytes)}; use {hint}"
        )
