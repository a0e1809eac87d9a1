"""Prefill attention where vLLM runs a model on its Triton attention backend
instead of the FlashAttention / FlashInfer kernels the calibration was fitted
on (docs/sim.md, "MXFP4 experts on Hopper and Ampere"). Read off vLLM 0.11.0's
code and a published L2 bandwidth, not fitted:

- **The backend.** `CudaPlatform.get_attn_backend_cls` (vllm/platforms/
  cuda.py) returns `TRITON_ATTN` when a layer has attention sinks (or an FP8 KV
  cache) on a GPU of compute capability 8.x or more that is not 9.0; SM 10.0
  takes FlashInfer before that test, SM 9.0 FlashAttention 3. gpt-oss's
  attention layers carry per-head sinks (vLLM `models/gpt_oss.py`), so an A100
  or an Ada GPU prefills gpt-oss with Triton; H100 and B200 do not.
- **Its tiles.** `unified_attention` (attention/ops/triton_unified_attention.py)
  packs the query heads that share a KV head into `BLOCK_M = 16` rows (the
  next power of two above 16 query heads per KV head) and walks the keys in
  tiles of `TILE_SIZE_PREFILL = 32`; each tile loads its keys and values
  (2 x 32 x head_dim elements) for those BLOCK_M rows alone, so the kernel does
  4 x BLOCK_M x 32 x head_dim FLOPs per 2 x 32 x head_dim KV elements loaded:
  2 x BLOCK_M / (bytes per element) FLOPs per byte, 16 for gpt-oss in bf16
  (FlashAttention's 128-row query blocks do 8 times as many per byte).
- **Where those bytes come from.** Every program re-reads its sequence's keys,
  so they come from L2 (Triton's pipelined 16-byte loads are `cp.async.cg`,
  which the PTX ISA caches at L2, not L1): the kernel runs at most at that
  intensity x the L2 bandwidth it can get. A100 80GB: 5,411 GB/s, the median
  of the L2-resident rows of a published measurement (te42kyfo/gpu-benches,
  gpu-l2-cache on an A100 SXM4 80GB: many SMs reading one shared data set, as
  the programs of one KV head here read its keys; data sets up to 20 MB, half
  the 40 MB L2, since each of its two partitions caches the lines its own SMs
  read), 75 % of the 7,219 GB/s the hardware's 5,120 bytes per clock at
  1,410 MHz promise (NVIDIA's A100 whitepaper: "2.3x the L2 cache read
  bandwidth of V100"). A GPU without a published figure keeps the calibrated
  cost.

The step-time model is not told the engine: like `sim/fp4_experts.py`, this
prices gpt-oss on Ampere as vLLM runs it. vLLM also sends an FP8 KV cache on
SM 8.x to Triton; that case is not modelled (no published run to check it on).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.presets import GpuSpec
from kvpool.spec import ModelSpec
from kvpool.spec.dtypes import row_bytes

SINK_MODEL_TYPES = frozenset({"gpt_oss"})  # attention layers with per-head sinks (vLLM models/gpt_oss.py)
# L2 read bandwidth measured with many SMs sharing the data, bytes/s (module docstring for the source;
# tests/data/gpu_l2_bandwidth/ holds the measurement)
L2_BYTES_PER_S = {"a100": 5410.85e9}


def picks_triton(gpu: GpuSpec, spec: ModelSpec) -> bool:
    """Whether vLLM's CUDA platform serves `spec`'s attention with its Triton
    backend on `gpu`: a model with attention sinks on SM 8.x (Ampere, Ada)."""
    return spec.config.get("model_type") in SINK_MODEL_TYPES and gpu.arch.lower().startswith(("ampere", "ada"))


def block_m(queries_per_kv: int) -> int:
    """unified_attention's BLOCK_M: 16 rows, or the next power of two above
    `queries_per_kv` query heads per KV head."""
    return 16 if queries_per_kv <= 16 else 1 << (queries_per_kv - 1).bit_length()


@dataclass(frozen=True)
class TritonPrefill:
    """The L2 roofline of Triton's prefill attention on one GPU."""

    block_m: int
    kv_element_bytes: int
    l2_bytes_per_s: float

    @property
    def flops_per_byte(self) -> float:
        """FLOPs per byte of keys and values a tile loads: 4 M T d / (2 T d e)."""
        return 2.0 * self.block_m / self.kv_element_bytes

    @property
    def flops_per_s(self) -> float:
        """The most attention FLOPs per second the L2 can feed."""
        return self.flops_per_byte * self.l2_bytes_per_s


def triton_prefill(gpu: GpuSpec, spec: ModelSpec) -> TritonPrefill | None:
    """The Triton prefill bound for `spec` on `gpu`, or None where vLLM picks
    another backend or the GPU's L2 bandwidth is not known."""
    l2 = L2_BYTES_PER_S.get(gpu.key)
    if l2 is None or not picks_triton(gpu, spec):
        return None
    tp = max(spec.tp_size, 1)
    heads = int(spec.config.get("num_attention_heads") or 1)
    kv_heads = int(spec.config.get("num_key_value_heads") or heads)
    per_kv = max(heads // tp, 1) // max(kv_heads // tp, 1)  # on one rank (KV heads replicated below tp)
    return TritonPrefill(block_m(max(per_kv, 1)), row_bytes(1, spec.kv_dtype), l2)
