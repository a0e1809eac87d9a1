"""Referee: the peak memory of vLLM's dummy sampler (`GPUModelRunner._dummy_sampler_run`,
the sampler half of `profile_run`, whose torch peak vLLM takes out of the KV budget), run
on CPU with PyTorch's profiler counting every allocation and free.

Reads a JSON list of cases on stdin ({"id", "rows", "vocab", "hidden"}), writes
{"id", "peak"} per case: the most bytes the call held at once, beyond the hidden states
passed in. On CUDA, top-k/top-p over 8 rows or more is a Triton kernel that rewrites the
logits in place (vllm/v1/sample/ops/topk_topp_sampler.py `apply_top_k_top_p`) and
FlashInfer samples from the logits; both are stood in for by calls that allocate nothing
of the logits' size, so the count is what vLLM's own Python allocates around them.
Imports the engine; never imported by kvpool.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any


def peak(case: dict[str, Any]) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm.v1.sample.ops import topk_topp_sampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    topk_topp_sampler.apply_top_k_top_p = lambda logits, k, p: logits
    topk_topp_sampler.flashinfer_sample = lambda logits, k, p, generators=None: logits.argmax(dim=-1)
    sampler = Sampler()
    top = sampler.topk_topp_sampler
    top.forward = top.forward_cuda  # CUDA's choice (FlashInfer first, then the native pass)
    lm_head = torch.zeros(case["hidden"], case["vocab"], dtype=torch.bfloat16)
    runner = types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(model_config=types.SimpleNamespace(multimodal_config=None)),
        model=types.SimpleNamespace(compute_logits=lambda h: h @ lm_head),
        device=torch.device("cpu"),
        sampler=sampler,
        speculative_config=None,
    )
    hidden = torch.zeros(case["rows"], case["hidden"], dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        GPUModelRunner._dummy_sampler_run(runner, hidden)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = most = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        most = max(most, live)
    return most


def main() -> None:
    out = []
    for case in json.load(sys.stdin):
        try:
            out.append({"id": case["id"], "peak": peak(case)})
        except Exception as e:  # reported, not hidden
            out.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
