"""Referee: SGLang's own KV pool sizing, run in SGLang's side venv (not kvpool's).

Reads a JSON list of cases on stdin, writes one JSON result per case. For each
case it publishes SGLang's `ServerArgs` (tp, page size, context length, ratios,
max running requests), reads the model with SGLang's own `ModelConfig`, builds
the `KVCacheConfigurator` the model runner builds (layer ids from the config;
no weights, no GPU), and calls its `config_from_budget` (the pool
configurator: `DefaultPoolConfigurator` / `HybridSWAPoolConfigurator`) and
`resolve_max_num_reqs` on the KV budget: what `_resolve_memory_pool_config`
does after profiling the free memory.

Run-time shims, none on the sizing path: `torchvision` is faked (the
multimodal config modules import it at module level; the vision wheel on PyPI
is built for CUDA torch), and `quantization_config` is dropped from the
config (SGLang's CPU build refuses mxfp4; weights quantisation does not change
the KV cache). This file imports SGLang and is never imported by kvpool.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import logging
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any


class _Anything:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()


class _FakeTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.28.0"  # type: ignore[attr-defined]
        module.__getattr__ = lambda name: _Anything()  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.meta_path.insert(0, _FakeTorchvision())
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.configs.model_config import AttentionArch, ModelConfig  # noqa: E402
from sglang.srt.mem_cache import kv_cache_configurator as kcm  # noqa: E402
from sglang.srt.model_executor.model_runner_components.layer_setup import ModelLayerInfo  # noqa: E402
from sglang.srt.model_executor.model_runner_components.load_model_utils import (  # noqa: E402
    resolve_sliding_window_size,
)
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (  # noqa: E402
    SpecAuxHiddenStateConfig,
)
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

DTYPES = {"auto": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def model_dir(config: str, root: Path) -> str:
    raw = json.loads(Path(config).read_text())
    raw.pop("quantization_config", None)
    where = root / Path(config).stem
    where.mkdir(exist_ok=True)
    (where / "config.json").write_text(json.dumps(raw))
    return str(where)


def run(case: dict[str, Any], root: Path) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model_path": model_dir(case["config"], root),
        "tp_size": case["tp"],
        "page_size": case["page_size"],
        "device": "cpu",
        "skip_tokenizer_init": True,
        "context_length": case["context_length"],
        "chunked_prefill_size": case["chunked_prefill_size"],
    }
    for key in ("max_running_requests", "swa_full_tokens_ratio"):
        if case.get(key) is not None:
            args[key] = case[key]
    if case.get("kv_dtype") == "fp8":
        args["kv_cache_dtype"] = "fp8_e4m3"
    server_args = ServerArgs(**args)
    runtime_context.publish(server_args, role="scheduler")
    mc = ModelConfig.from_server_args(server_args)
    n = mc.num_hidden_layers
    layers = ModelLayerInfo(
        start_layer=0,
        end_layer=n,
        num_effective_layers=n,
        swa_attention_layer_ids=mc.swa_attention_layer_ids,
        full_attention_layer_ids=mc.full_attention_layer_ids,
    )
    kvc = kcm.KVCacheConfigurator(
        device="cpu",
        gpu_id=0,
        attn_dp_size=1,
        pp_size=1,
        pp_group=None,
        model=None,
        model_config=mc,
        server_args=server_args,
        kv_cache_dtype=DTYPES[case.get("kv_dtype") or "auto"],
        kv_cache_dtype_str=args.get("kv_cache_dtype", "auto"),
        model_dtype=torch.bfloat16,
        page_size=case["page_size"],
        sliding_window_size=resolve_sliding_window_size(None, mc),
        spec_algorithm=SpeculativeAlgorithm.NONE,
        is_draft_worker=False,
        post_capture_kv_active=False,
        spec_aux_config=SpecAuxHiddenStateConfig(),
        is_hybrid_swa=mc.is_hybrid_swa,
        is_hybrid_swa_compress=False,
        use_mla_backend=mc.attention_arch == AttentionArch.MLA,
        layer_info=layers,
        forward_stream=None,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
    )
    out: dict[str, Any] = {"id": case["id"]}
    try:
        config = kvc.config_from_budget(case["memory"])
        running = kvc.resolve_max_num_reqs(config.max_total_num_tokens)
    except (ValueError, RuntimeError) as e:
        out["refused"] = str(e).split(". ")[0]
        return out
    out.update(
        refused=None,
        max_total_num_tokens=config.max_total_num_tokens,
        swa_tokens=config.swa_max_total_num_tokens if mc.is_hybrid_swa else None,
        max_running_requests=running,
    )
    return out


def main() -> None:
    cases = json.load(sys.stdin)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            try:
                results.append(run(case, Path(tmp)))
            except Exception as e:  # a case SGLang cannot size at all is reported, not hidden
                results.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
