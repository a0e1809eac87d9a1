"""Referee: what vLLM's own KV cache manager allocates on the decode side of a
prefill/decode handoff, run in vLLM's side venv (not kvpool's;
tests/test_fleet_handoff_vllm.py starts it).

Reads a JSON list of cases on stdin ({"id", "config", "prompt_tokens",
"block_size", "kv_dtype", "mamba_cache_mode", "tp", and for a hybrid whose
model class this venv cannot import, "aligned": {"block_size",
"mamba_page_size_padded"}}) and writes one JSON
result per case. For each case it builds the model's KV cache groups with
vLLM's own planning (the per-layer specs of vllm_runner.py, plus Qwen3-Next's
gated-delta-net state layers, which vLLM registers as MambaSpec), makes a
`KVCacheManager` with enough blocks, and lets a request of `prompt_tokens`
tokens adopt them all as external computed tokens, as vLLM's scheduler does
for a request whose KV a prefill worker computed (`allocate_slots(request, 0,
num_external_computed_tokens=L, delay_cache_blocks=True)`, the
NixlConnector's `do_remote_prefill` path). Per KV cache group it reports the
kind, the layers, the block size, the request's non-null blocks (what the
transfer fills) and the page bytes per layer (unpadded: `real_page_size_bytes`).

Only the inputs are ours; every block count is vLLM's. This file imports vLLM
and is never imported by kvpool or its tests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from typing import Any

import torch  # noqa: E402
import vllm_runner as vr  # noqa: E402  (this directory: the shared per-layer specs)
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

logging.disable(logging.WARNING)
KINDS = (
    (MambaSpec, "state"),
    (SlidingWindowSpec, "sliding"),
    (ChunkedLocalAttentionSpec, "chunked"),
    (MLAAttentionSpec, "full"),
    (FullAttentionSpec, "full"),
)
HUGE = 1 << 44  # bytes offered to the planner; the manager then gets just the blocks the request needs


def kind_of(spec: KVCacheSpec) -> str:
    return next(kind for cls, kind in KINDS if isinstance(spec, cls))


def gdn_specs(case: dict[str, Any], vc: Any, specs: dict[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Qwen3-Next: its linear-attention layers are gated-delta-net states (vLLM's
    Qwen3NextGatedDeltaNet: MambaStateShapeCalculator.gated_delta_net_state_shape
    and _dtype, registered through MambaBase.get_kv_cache_spec)."""
    c = vr.text_config(case["config"])
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        case["tp"],
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
        c.linear_conv_kernel_dim,
        0,
    )
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        torch.bfloat16, "auto", vc.cache_config.mamba_ssm_cache_dtype
    )
    out = dict(specs)
    for i, kind in enumerate(c.layer_types):
        if kind == "linear_attention":
            out[f"model.layers.{i}.attn"] = MambaSpec(
                block_size=vc.cache_config.block_size,
                shapes=shapes,
                dtypes=dtypes,
                page_size_padded=vc.cache_config.mamba_page_size_padded,
                mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
                mamba_cache_mode=case.get("mamba_cache_mode", "align"),
            )
    return out


def run(case: dict[str, Any]) -> dict[str, Any]:
    L = case["prompt_tokens"]
    full = {
        "id": case["id"],
        "config": case["config"],
        "tp": case.get("tp", 1),
        "pp": 1,
        "block_size": case["block_size"],
        "kv_dtype": case.get("kv_dtype", "auto"),
        "memory": HUGE,
        "max_model_len": L + case["block_size"],
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 256,
        "async_scheduling": False,
        "draft": None,
        "mamba_cache_mode": case.get("mamba_cache_mode", "align"),
        "mamba_ssm_cache_dtype": "auto",
    }
    vc = vr.vllm_config(full)
    c = vr.text_config(full["config"])
    qwen3_next = c.model_type == "qwen3_next"
    if "aligned" in case:
        # vLLM cannot import Qwen3NextForCausalLM in this CPU venv (its quantization imports need
        # compressed_tensors), so Platform._align_hybrid_block_size cannot ask the model class for its
        # state: the case gives the aligned block size and the padded state page instead
        vc.cache_config.block_size = case["aligned"]["block_size"]
        vc.cache_config.mamba_block_size = case["aligned"]["block_size"]
        vc.cache_config.mamba_page_size_padded = case["aligned"]["mamba_page_size_padded"]
    elif getattr(c, "hybrid_override_pattern", None):
        vr.align_hybrid_block_size(full, vc)
    specs = vr.target_specs(full, vc)
    if qwen3_next:
        specs = gdn_specs(full, vc, specs)
    cfg = vr.kv_cache_configs(vc, [specs], [HUGE])[0]
    bs = vc.cache_config.block_size
    need = sum(-(-L // g.kv_cache_spec.block_size) for g in cfg.kv_cache_groups) + 8
    cfg = dataclasses.replace(cfg, num_blocks=need)
    manager = KVCacheManager(
        kv_cache_config=cfg,
        max_model_len=full["max_model_len"],
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=True,
    )
    request = Request("handoff", list(range(L)), SamplingParams(max_tokens=16), None)
    blocks = manager.allocate_slots(request, 0, num_external_computed_tokens=L, delay_cache_blocks=True)
    if blocks is None:
        raise RuntimeError(f"vLLM could not allocate {L} external tokens in {need} blocks")
    groups = []
    for group, held in zip(cfg.kv_cache_groups, manager.coordinator.get_blocks(request.request_id), strict=True):
        spec = group.kv_cache_spec
        groups.append(
            {
                "kind": kind_of(spec),
                "layers": len(group.layer_names),
                "block_size": spec.block_size,
                "blocks": sum(not b.is_null for b in held),
                "table": len(held),
                "layer_page_bytes": spec.real_page_size_bytes,
            }
        )
    return {"id": case["id"], "block_size": bs, "groups": groups}


def main() -> None:
    results = []
    for case in json.load(sys.stdin):
        try:
            results.append(run(case))
        except Exception as e:  # reported, not hidden
            results.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
