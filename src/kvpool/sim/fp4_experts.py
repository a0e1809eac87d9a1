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
- **Its padding.** vLLM's `moe_align_block_size` pads every expert's rows to
  a whole number of blocks, and the blocks run in full (the kernel's tile is
  `moe_block_size` rows; `block_num_valid_tokens` masks only the loads and
  stores of the padding rows, marlin_template.h). Tokens route
  independently (the assumption `Shapes.touched_experts` already makes), so
  an expert's rows are Binomial(tokens, top_k / experts), not the mean: a
  step of 2,048 tokens of gpt-oss-120b (64 rows per expert on average, one
  block of 64) runs 1.47 blocks per expert, not 1 (`expected_blocks`).
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=4096)
def expected_blocks(tokens: int, top_k: int, experts: int, block: int) -> float:
    """Expected blocks of `block` rows all `experts` experts run for a step of
    `tokens` tokens, each token picking `top_k` experts independently: an
    expert's rows X are Binomial(tokens, top_k / experts) and it runs
    ceil(X / block) blocks, E[ceil(X / B)] = sum over j >= 0 of P(X > j B)."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    p = min(top_k / experts, 1.0)
    if p >= 1.0:
        return float(experts * math.ceil(tokens / block))
    mean, sd = tokens * p, math.sqrt(tokens * p * (1.0 - p))
    lo, hi = max(0, int(mean - 12 * sd) - 1), min(tokens, int(mean + 12 * sd) + 2)
    log_norm = math.lgamma(tokens + 1)
    per_expert = 0.0
    for x in range(max(lo, 1), hi + 1):  # P(X = x) x ceil(x / B); beyond 12 sd the mass is below 1e-30
        log_pmf = log_norm - math.lgamma(x + 1) - math.lgamma(tokens - x + 1)
        log_pmf += x * math.log(p) + (tokens - x) * math.log1p(-p)
        per_expert += math.exp(log_pmf) * math.ceil(x / block)
    return experts * per_expert


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
