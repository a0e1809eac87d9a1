"""How 4-bit (MXFP4) routed experts run on GPUs without FP4 tensor cores, as
vLLM runs them: why gpt-oss on Hopper and Ampere is slower than its bytes
and FLOPs at the BF16 rates say. Every factor is read off vLLM's kernels or a
published measurement, none is fitted (docs/sim.md, "MXFP4 experts").

- **The kernel.** vLLM's `get_mxfp4_backend` (model_executor/layers/
  quantization/mxfp4.py, 0.10-0.32) gives SM80 and SM89 the Marlin MoE kernel,
  and SM90 too unless `triton_kernels` is installed, which is not on PyPI
  (`has_triton_kernels`: "the optional `triton_kernels` package"), so a
  `pip install vllm` serves gpt-oss on Hopper with Marlin. FP4 tensor cores
  (Blackwell) take other kernels; those GPUs keep the generic expert cost.
- **Its MMA.** Marlin dequantizes the 4-bit weights to BF16 in registers and
  multiplies with the warp-level `mma.sync` of Ampere. On Hopper that
  instruction reaches about 2/3 of the tensor cores' peak, which only `wgmma`
  reaches (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, section 2,
  after Luo et al. 2024's microbenchmarks); on Ampere and Ada it is the peak
  instruction.
- **Its tiles.** Marlin MoE splits each expert's tokens into blocks of
  `block_size_m` rows, the first of 8, 16, 32, 48, 64 with tokens x top_k /
  experts / block < 0.9, else 64 (experts/marlin_moe.py, `fused_marlin_moe`);
  a block computes whole rows and streams its expert's weights again, so a
  large step reads each touched expert's weights once per 64 of its tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpool.presets import GpuSpec

MARLIN_BLOCKS = (8, 16, 32, 48, 64)  # vLLM fused_marlin_moe's block_size_m candidates
HOPPER_MMA_SYNC_SHARE = 2 / 3  # mma.sync on Hopper: ~2/3 of the tensor peak (FlashAttention-3, section 2)


@dataclass(frozen=True)
class Fp4Experts:
    """The MoE kernel of 4-bit experts on one GPU: `mma_share` of the BF16
    tensor peak its MMA instruction reaches; tiles from `block_rows`."""

    kernel: str
    mma_share: float
    source: str

    def block_rows(self, tokens: float, top_k: int, experts: int) -> int:
        """Marlin's block_size_m for a step of `tokens` tokens (vLLM's rule)."""
        per_expert = tokens * top_k / max(experts, 1)
        for block in MARLIN_BLOCKS:
            if per_expert / block < 0.9:
                return block
        return MARLIN_BLOCKS[-1]

    def blocks(self, rows: float, block: int) -> float:
        """Blocks an expert that got `rows` rows runs (each streams its weights)."""
        return float(math.ceil(rows / block)) if rows > 0 else 0.0


def fp4_experts(gpu: GpuSpec) -> Fp4Experts | None:
    """The kernel vLLM runs 4-bit experts with on `gpu`, or None where FP4
    tensor cores or another vendor's kernels run them (the generic cost)."""
    arch = gpu.arch.lower()
    if arch.startswith(("ampere", "ada")):
        return Fp4Experts("marlin", 1.0, f"{gpu.arch}: Marlin MoE, mma.sync is the peak instruction")
    if arch.startswith("hopper"):
        return Fp4Experts(
            "marlin",
            HOPPER_MMA_SYNC_SHARE,
            f"{gpu.arch}: Marlin MoE (no triton_kernels from PyPI), mma.sync at ~2/3 of the wgmma peak",
        )
    return None
