"""The profile phase's figures (docs/plan.md, "Profile phase"): pages per
warmup shape, the profile plan and its estimate, next to TensorRT-LLM's
three-term estimate of its temporary pool. Pure arithmetic, no timing.

    python benchmarks/profile_phase.py
"""

from __future__ import annotations

import math

from kvpool.plan import ServingLimits, estimate_profile_bytes, plan_pools
from kvpool.plan.batches import warmup_constraints
from kvpool.plan.feasibility import batch_floors
from kvpool.spec import load_model_spec
from kvpool.units import format_bytes

MODELS = (("llama-3.1-8b-instruct", "bf16"), ("gemma-3-27b", "bf16"), ("deepseek-v4-flash", "fp8"))


def trtllm_blocks(limits: ServingLimits, tpb: int) -> int:
    """max(context dummies, one max-length graph dummy + the rest of the largest graph batch, B)."""
    context = math.ceil(((limits.max_num_tokens or 0) + 1 + limits.max_draft_len) / tpb)
    graph = math.ceil((limits.max_seq_len + 1) / tpb) + limits.largest_graph_batch - 1
    return max(context, graph, limits.max_batch_size)


def main() -> None:
    limits = ServingLimits(max_batch_size=1024, max_seq_len=131072, max_num_tokens=8192)
    for name, dtype in MODELS:
        spec = load_model_spec(name, kv_dtype=dtype)
        estimate = estimate_profile_bytes(spec, limits)
        tpb = spec.tokens_per_block
        print(
            f"{name} ({dtype}, {tpb} tokens per page): estimate {format_bytes(estimate)}, "
            f"TensorRT-LLM {trtllm_blocks(limits, tpb)} blocks"
        )
        for c in warmup_constraints(limits):
            print(f"  {c.name:15s} {batch_floors(spec, c.batch)}")
        plan = plan_pools(spec, limits, kv_memory_bytes=estimate, phase="profile")
        print(f"  {'profile plan':15s} {dict((g.name, g.pages) for g in plan.groups)}")


if __name__ == "__main__":
    main()
