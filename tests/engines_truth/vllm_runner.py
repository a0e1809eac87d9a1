"""Referee: vLLM's own KV cache sizing, run in vLLM's side venv (not kvpool's).

Reads a JSON list of cases on stdin and writes one JSON result per case to
stdout. For each case it builds the per-layer KV cache specs with vLLM's spec
classes (`FullAttentionSpec`, `SlidingWindowSpec`, `ChunkedLocalAttentionSpec`,
`MLAAttentionSpec`, `MambaSpec` with vLLM's own `MambaStateShapeCalculator`)
from the model's config.json as transformers parses it, then runs vLLM's
`get_kv_cache_configs` -> `generate_scheduler_kv_cache_config` ->
`get_kv_cache_capacity`, the path `EngineCore._initialize_kv_caches` takes.
The refusal message, when vLLM refuses, is the one vLLM raises.

Only the per-layer geometry is read here (what each attention layer's
`get_kv_cache_spec` registers: KV heads per rank max(1, heads // tp), head
size, cache dtype, window); every number compared is computed by vLLM.
This file imports vLLM and is never imported by kvpool or its tests.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import fields, replace
from types import MethodType, SimpleNamespace
from typing import Any

import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402
from vllm.config import SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.distributed.utils import get_pp_indices  # noqa: E402
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator  # noqa: E402
from vllm.model_executor.models.config import NemotronHForCausalLMConfig
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # noqa: E402
from vllm.v1.core import kv_cache_utils as ku  # noqa: E402

try:  # vLLM 0.33 moved the planning out of kv_cache_utils
    from vllm.v1.core import kv_cache_planning as planning
except ImportError:  # vLLM 0.32
    planning = None
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

logging.disable(logging.WARNING)
DTYPES = {"auto": torch.bfloat16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def text_config(path: str) -> Any:
    cfg = AutoConfig.from_pretrained(path) if not path.endswith(".json") else None
    if cfg is None:
        with open(path) as f:
            raw = json.load(f)
        cls = type(AutoConfig.for_model(raw["model_type"]))
        cfg = cls.from_dict(raw)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def drafted(spec: KVCacheSpec) -> KVCacheSpec:
    """A drafter's layer spec as the model runner registers it: `is_draft` set
    (vLLM 0.33; 0.32's specs have no such field)."""
    if "is_draft" in {f.name for f in fields(spec)}:
        return replace(spec, is_draft=True)
    return spec


def draft_specs(
    case: dict[str, Any], vc: VllmConfig, first: int, target: dict[str, KVCacheSpec]
) -> dict[str, KVCacheSpec]:
    """The drafter's layers, registered after the target's: MTP layers repeat the
    target's (last) full-attention layer spec (an MTP block is a full decoder layer of
    the target's: DeepSeek's MLA); a draft model or EAGLE head registers its own
    full-attention layers."""
    draft = case["draft"]
    if draft["method"] == "mtp":
        windowed = (SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)
        last = [x for x in target.values() if not isinstance(x, windowed)][-1]
        return {f"model.layers.{first + i}.attn": drafted(last) for i in range(draft["layers"])}
    c = text_config(draft["config"])
    tp, bs = case["tp"], vc.cache_config.block_size
    heads = c.num_attention_heads
    kv_heads = max(1, (getattr(c, "num_key_value_heads", None) or heads) // tp)
    head = getattr(c, "head_dim", None) or c.hidden_size // heads
    dtype = DTYPES[case.get("kv_dtype", "auto")]
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=dtype)
    return {f"model.layers.{first + i}.attn": drafted(spec) for i in range(c.num_hidden_layers)}


def speculative_config(case: dict[str, Any]) -> Any:
    """The fields of SpeculativeConfig the sizing path reads, its methods vLLM's own."""
    draft = case["draft"]
    ns = SimpleNamespace(
        method=draft["method"],
        num_speculative_tokens=draft["num_speculative_tokens"],
        disable_eagle_block_drop=False,
        draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(num_nextn_predict_layers=draft.get("layers", 1))),
    )
    for name in (
        "use_eagle",
        "use_eagle_block_drop",
        "use_multi_module_mtp",
        "needs_eagle_block_drop",  # 0.33
        "use_dflash",
        "use_dspark",
    ):
        if hasattr(SpeculativeConfig, name):
            setattr(ns, name, MethodType(getattr(SpeculativeConfig, name), ns))
    return ns


def layer_specs(case: dict[str, Any], vc: VllmConfig) -> dict[str, KVCacheSpec]:
    """What each layer's `get_kv_cache_spec` registers on one TP rank (at the block
    size the platform settled on: vc.cache_config.block_size), a drafter's layers last."""
    specs = target_specs(case, vc)
    if case.get("draft"):
        specs.update(draft_specs(case, vc, text_config(case["config"]).num_hidden_layers, specs))
    return specs


def target_specs(case: dict[str, Any], vc: VllmConfig) -> dict[str, KVCacheSpec]:
    """The served model's own layers."""
    c = text_config(case["config"])
    tp, bs = case["tp"], vc.cache_config.block_size
    dtype = DTYPES[case.get("kv_dtype", "auto")]
    heads = c.num_attention_heads
    kv_heads = max(1, (getattr(c, "num_key_value_heads", None) or heads) // tp)
    head = getattr(c, "head_dim", None) or c.hidden_size // heads
    n = c.num_hidden_layers
    kinds = list(getattr(c, "layer_types", None) or ["full_attention"] * n)
    pattern = getattr(c, "hybrid_override_pattern", None)
    if pattern:
        kinds = [{"M": "mamba", "*": "full_attention"}.get(ch, "none") for ch in pattern]
    if c.model_type == "jamba":  # transformers' JambaConfig.layers_block_type: attention or mamba (Mamba-1)
        kinds = ["full_attention" if t == "attention" else "mamba1" for t in c.layers_block_type]
    if c.model_type == "falcon_h1":  # every layer: attention and a Mamba-2 mixer side by side
        kinds = ["full_attention"] * n + ["falcon_mamba"] * n
    chunk = getattr(c, "attention_chunk_size", None)
    if chunk and getattr(c, "no_rope_layers", None):
        # Llama 4: RoPE layers attend within chunks, NoPE layers (no_rope_layers[i] == 0) globally.
        kinds = ["chunked_attention" if r else "full_attention" for r in c.no_rope_layers]
    specs: dict[str, KVCacheSpec] = {}
    for i, kind in enumerate(kinds):
        name = f"model.layers.{i}.attn"
        if kind == "none":
            continue
        if getattr(c, "kv_lora_rank", None):
            specs[name] = MLAAttentionSpec(
                block_size=bs, num_kv_heads=1, head_size=c.kv_lora_rank + c.qk_rope_head_dim, dtype=dtype
            )
        elif kind == "sliding_attention":
            specs[name] = SlidingWindowSpec(
                block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=dtype, sliding_window=c.sliding_window
            )
        elif kind == "chunked_attention":
            specs[name] = ChunkedLocalAttentionSpec(
                block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=dtype, attention_chunk_size=chunk
            )
        elif kind == "falcon_mamba":
            # vLLM's FalconH1ForCausalLM: MambaMixer2 of mamba_d_ssm channels (one prefill checkpoint block)
            shapes = MambaStateShapeCalculator.mamba2_state_shape(
                tp, c.mamba_d_ssm, c.mamba_n_groups, c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state, c.mamba_d_conv
            )
            dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(
                torch.bfloat16, "auto", vc.cache_config.mamba_ssm_cache_dtype
            )
            specs[f"model.layers.{i - n}.mamba"] = MambaSpec(
                block_size=bs,
                shapes=shapes,
                dtypes=dtypes,
                mamba_cache_mode=case.get("mamba_cache_mode", "align"),
                page_size_padded=vc.cache_config.mamba_page_size_padded,
                num_prefill_checkpoint_blocks=1,
                prefill_checkpoint_alignment=1,
            )
        elif kind == "mamba1":
            # vLLM's JambaForCausalLM state: MambaStateShapeCalculator.mamba1_state_shape in the model dtype
            shapes = MambaStateShapeCalculator.mamba1_state_shape(
                tp, c.mamba_expand * c.hidden_size, c.mamba_d_state, c.mamba_d_conv
            )
            dtypes = MambaStateDtypeCalculator.mamba1_state_dtype(
                torch.bfloat16, "auto", vc.cache_config.mamba_ssm_cache_dtype
            )
            specs[name] = MambaSpec(
                block_size=bs,
                shapes=shapes,
                dtypes=dtypes,
                mamba_cache_mode=case.get("mamba_cache_mode", "align"),
                page_size_padded=vc.cache_config.mamba_page_size_padded,
            )
        elif kind == "mamba":
            shapes = MambaStateShapeCalculator.mamba2_state_shape(
                tp,
                c.mamba_num_heads * c.mamba_head_dim,
                c.n_groups,
                c.mamba_num_heads,
                c.mamba_head_dim,
                c.ssm_state_size,
                c.conv_kernel,
            )
            # vLLM's NemotronHForCausalLMConfig: an `auto` SSM cache dtype becomes the
            # config's mamba_ssm_cache_dtype, else float32.
            cache = SimpleNamespace(mamba_ssm_cache_dtype="auto")
            NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache, hf_config=c)
            dtypes = MambaStateDtypeCalculator.mamba2_state_dtype(torch.bfloat16, "auto", cache.mamba_ssm_cache_dtype)
            specs[name] = MambaSpec(
                block_size=bs,
                shapes=shapes,
                dtypes=dtypes,
                mamba_cache_mode=case.get("mamba_cache_mode", "align"),
                page_size_padded=vc.cache_config.mamba_page_size_padded,
                # MambaMixer2.get_kv_cache_spec: one prefill checkpoint block
                num_prefill_checkpoint_blocks=1,
                prefill_checkpoint_alignment=1,
            )
        else:
            specs[name] = FullAttentionSpec(block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=dtype)
    return specs


def vllm_config(case: dict[str, Any]) -> VllmConfig:
    vc = VllmConfig()
    L = case["max_model_len"]
    # The fields of ModelConfig the sizing path reads (no model is loaded).
    vc.model_config = SimpleNamespace(  # type: ignore[assignment]
        max_model_len=L,
        original_max_model_len=L,
        hf_config=SimpleNamespace(model_type=text_config(case["config"]).model_type),
        use_mla=False,
        # 0.33's default KVCacheConfigBuilder: no model-declared grouping (SupportsKVCacheGrouping)
        supports_kv_cache_grouping=False,
    )
    vc.scheduler_config.max_num_batched_tokens = case["max_num_batched_tokens"]
    vc.scheduler_config.max_num_seqs = case["max_num_seqs"]
    vc.scheduler_config.async_scheduling = case["async_scheduling"]
    vc.scheduler_config.disable_hybrid_kv_cache_manager = not case.get("hybrid", True)
    vc.parallel_config.pipeline_parallel_size = case.get("pp", 1)
    vc.parallel_config.tensor_parallel_size = case["tp"]
    vc.cache_config.mamba_cache_mode = case.get("mamba_cache_mode", "align")
    vc.cache_config.mamba_ssm_cache_dtype = case.get("mamba_ssm_cache_dtype", "auto")  # --mamba-ssm-cache-dtype
    vc.cache_config.block_size = case["block_size"]
    vc.device_config = SimpleNamespace(device_type="cuda")  # type: ignore[assignment]
    if case.get("draft"):
        vc.speculative_config = speculative_config(case)
    # The layout the engine core resolves for FlashAttention (the GPU default backend).
    layouts = FlashAttentionBackend.supported_kv_cache_layouts() or ()
    resolve_kv_cache_layout(vc, [[x.name for x in layouts] or ["NHD"]])
    return vc


def align_hybrid_block_size(case: dict[str, Any], vc: VllmConfig) -> None:
    """vLLM's own `Platform._align_hybrid_block_size` for a model with Mamba layers:
    the attention block size raised until a page holds one Mamba state, the Mamba
    page padded to it (the model class gives the state shapes and dtypes)."""
    c = text_config(case["config"])
    with open(case["config"]) as f:
        raw = json.load(f)
    original = vc.model_config
    vc.model_config = SimpleNamespace(  # type: ignore[assignment]
        **vars(original),
        hf_text_config=c,
        dtype=torch.bfloat16,
        architecture=raw["architectures"][0],
        architectures=raw["architectures"],
        model_impl="auto",
        runner_type="generate",
        convert_type="none",
        is_hybrid=True,
        is_attention_free=False,
        trust_remote_code=False,
        get_num_kv_heads=lambda pc: max(1, c.num_key_value_heads // pc.tensor_parallel_size),
        get_head_size=lambda: getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
    )
    vc.model_config.hf_config = c
    if c.model_type == "nemotron_h":  # its config class sets the SSM cache dtype (Jamba has none)
        NemotronHForCausalLMConfig.verify_and_update_config(vc)
    Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
    vc.model_config = original


def kv_cache_configs(vc: VllmConfig, workers: list[dict[str, KVCacheSpec]], memory: list[int]) -> list[Any]:
    """`get_kv_cache_configs` as the engine core calls it: 0.32 in kv_cache_utils;
    0.33 in kv_cache_planning, after `get_global_kv_cache_groups` groups the whole model."""
    if planning is None:
        return ku.get_kv_cache_configs(vc, workers, memory)  # type: ignore[attr-defined]
    groups = planning.get_global_kv_cache_groups(vc, workers)
    return planning.get_kv_cache_configs(vc, workers, memory, groups)


def run(case: dict[str, Any]) -> dict[str, Any]:
    vc = vllm_config(case)
    c = text_config(case["config"])
    if getattr(c, "hybrid_override_pattern", None) or c.model_type in ("jamba", "falcon_h1"):
        align_hybrid_block_size(case, vc)
    specs = layer_specs(case, vc)
    out: dict[str, Any] = {"id": case["id"], "max_concurrent_batches": vc.max_concurrent_batches}
    pp = case.get("pp", 1)
    names = list(specs)
    n = text_config(case["config"]).num_hidden_layers + (len(specs) - len(target_specs(case, vc)))
    workers = [specs] if pp == 1 else []
    for rank in range(pp if pp > 1 else 0):
        start, end = get_pp_indices(n, rank, pp)
        workers.append({k: specs[k] for k in names if start <= int(k.split(".")[2]) < end})
    try:
        configs = kv_cache_configs(vc, workers, [case["memory"]] * len(workers))
    except ValueError as e:
        msg = str(e)
        est = re.search(r"estimated maximum model length is (\d+)", msg)
        out.update(refused=msg.split(". ")[0], estimated_max_len=int(est.group(1)) if est else 0)
        return out
    cfg = ku.generate_scheduler_kv_cache_config(configs)
    tokens, concurrency = ku.get_kv_cache_capacity(vc, cfg)
    groups = cfg.kv_cache_groups
    out.update(
        refused=None,
        num_gpu_blocks=cfg.num_blocks,
        kv_cache_groups=len(groups),
        block_size=min(g.kv_cache_spec.block_size for g in groups),
        block_sizes=sorted({g.kv_cache_spec.block_size for g in groups}),
        gpu_kv_cache_tokens=tokens,
        max_concurrency=round(concurrency, 2),
        eagle_groups=sum(bool(getattr(g, "is_eagle_group", False)) for g in groups),
        line=f"{ku._kv_cache_device_name(vc)} KV cache size: {tokens:,} tokens, "
        f"Maximum concurrency for {case['max_model_len']:,} tokens per request: {concurrency:.2f}x",
    )
    return out


def main() -> None:
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        try:
            results.append(run(case))
        except Exception as e:  # a case vLLM cannot size at all is reported, not hidden
            results.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
