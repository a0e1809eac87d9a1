"""Referee: SGLang 0.5.23's HiCache host pool sizing, run in its side venv.

Reads a JSON list of cases on stdin: the device pools of a hybrid model as
kvpool's SGLang model sizes them (KV tokens, bytes per token and page size;
Mamba slots, layers and the per-layer conv / SSM state shapes and dtype) and
`--hicache-size` (GB) or `--hicache-ratio`. For each case it runs SGLang's own
`_split_hicache_size` on pools of those device bytes, then builds SGLang's
`MambaPoolHost` on CPU device tensors of those shapes (one checkpoint each,
no GPU) and a `HostKVCache` of that geometry (`is_dummy`: its sizing in
`__init__`, no buffer), and writes the host pools' token and slot counts.
Imports SGLang; never imported by kvpool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import sglang_runner  # noqa: E402,F401  (its torchvision stub)
import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _split_hicache_size  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import HostKVCache  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


class SizingOnly(HostKVCache):
    """HostKVCache's own sizing (`__init__`), its buffer never allocated."""

    def get_size_per_token(self) -> int:  # the value __init__ was given
        return int(self.size_per_token)

    def init_kv_buffer(self) -> Any:
        return None

    def load_to_device_per_layer(self, *args: Any, **kwargs: Any) -> None: ...

    def backup_from_device_all_layer(self, *args: Any, **kwargs: Any) -> None: ...

    def get_data_page(self, *args: Any, **kwargs: Any) -> Any: ...

    def get_dummy_flat_data_page(self) -> Any: ...

    def set_from_flat_data_page(self, *args: Any, **kwargs: Any) -> None: ...


for name in list(getattr(SizingOnly, "__abstractmethods__", ())):
    setattr(SizingOnly, name, lambda self, *a, **k: None)
SizingOnly.__abstractmethods__ = frozenset()


def run(case: dict[str, Any]) -> dict[str, Any]:
    kv_device_bytes = case["kv_tokens"] * case["kv_token_bytes"]
    state_bytes = case["mamba_layers"] * case["state_layer_bytes"]
    kv_share, mamba_share = 0.0, 0.0
    size = case.get("size_gb")
    if size:
        pools = (
            SimpleNamespace(get_kv_size_bytes=lambda: kv_device_bytes),
            SimpleNamespace(get_kv_size_bytes=lambda: state_bytes * case["mamba_slots"]),
        )
        kv_share, mamba_share = _split_hicache_size(size, pools)
    kv = SizingOnly(
        dtype=torch.bfloat16,
        device_capacity_tokens=case["kv_tokens"],
        size_per_token=case["kv_token_bytes"],
        start_layer=0,
        end_layer=1,
        host_to_device_ratio=case["ratio"],
        host_size=kv_share,
        page_size=case["page_size"],
        layout="layer_first",
        pin_memory=False,
        device="cpu",
        is_dummy=True,
    )
    layers, dtype = case["mamba_layers"], DTYPES[case["state_dtype"]]
    conv = torch.zeros((layers, 1, *case["conv_shape"]), dtype=DTYPES[case["conv_dtype"]])
    temporal = torch.zeros((layers, 1, *case["ssm_shape"]), dtype=dtype)
    mamba = MambaPoolHost(
        MambaStateBufferInfo(temporal=temporal, conv=(conv,)),
        case["ratio"],
        mamba_share,
        device_capacity=case["mamba_slots"],
        pin_memory=False,
        device="cpu",
        layout="page_first",
    )
    return {"id": case["id"], "kv_tokens": kv.size, "mamba_slots": mamba.size, "mamba_slot_bytes": mamba.size_per_token}


def main() -> None:
    out = []
    for case in json.load(sys.stdin):
        try:
            out.append(run(case))
        except Exception as e:  # reported, not hidden
            out.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
