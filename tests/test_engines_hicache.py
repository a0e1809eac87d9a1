"""SGLang 0.5.23's HiCache host pools for a hybrid model (engines/hicache.py)
against SGLang's own `_split_hicache_size`, `HostKVCache` and `MambaPoolHost`
sizing in its side venv (tests/engines_truth/hicache_runner.py), on the device
pools kvpool's SGLang model gives a small Jamba-like model (real host buffers
are allocated for the Mamba pool, so the model is small)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from engines_truth.lane import HERE, engine_python, run_engine
from kvpool import ServingLimits, load_model_spec
from kvpool.engines import sglang
from kvpool.engines.hicache import sglang_host_pools
from kvpool.errors import LimitsError

TINY_JAMBA: dict[str, Any] = {
    "model_type": "jamba",
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_period": 4,
    "attn_layer_offset": 2,
    "mamba_d_state": 4,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
# (page size, KV budget, --hicache-size GB or None, --hicache-ratio)
CASES = [(1, 8 << 20, None, 2.0), (16, 8 << 20, None, 4.0), (1, 8 << 20, 0.05, 2.0), (16, 16 << 20, 0.2, 2.0)]
IDS = [f"p{p}-{m >> 20}m-" + (f"size{s}" if s else f"ratio{r}") for p, m, s, r in CASES]


def report(page: int, memory: int) -> Any:
    spec = load_model_spec(TINY_JAMBA)
    return sglang.allocate(spec, ServingLimits(max_seq_len=4096, max_batch_size=64), memory, page_size=page)


def referee_case(cid: str, page: int, memory: int, size: float | None, ratio: float) -> dict[str, Any]:
    r = report(page, memory)
    full, mamba = r.pool("full"), r.pool("mamba")
    d_inner = TINY_JAMBA["mamba_expand"] * TINY_JAMBA["hidden_size"]
    return {
        "id": cid,
        "kv_tokens": full.tokens,
        "kv_token_bytes": full.page_bytes // full.page_tokens,
        "page_size": page,
        "ratio": ratio,
        "size_gb": size,
        "mamba_layers": 6,
        "mamba_slots": mamba.pages,
        "state_layer_bytes": mamba.page_bytes // 6,
        "conv_shape": [TINY_JAMBA["mamba_d_conv"] - 1, d_inner],
        "ssm_shape": [d_inner, TINY_JAMBA["mamba_d_state"]],
        "conv_dtype": "bf16",
        "state_dtype": "bf16",
    }


@pytest.fixture(scope="module")
def theirs() -> dict[str, dict[str, Any]]:
    if engine_python("sglang") is None:
        if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
            pytest.fail("the sglang side venv is missing: run `make engines-venvs`")
        pytest.skip("no sglang side venv (make engines-venvs)")
    cases = [referee_case(i, *c) for i, c in zip(IDS, CASES, strict=True)]
    return run_engine("sglang", cases, HERE / "hicache_runner.py")


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_host_pools_are_sglangs(index: int, theirs: dict[str, dict[str, Any]]) -> None:
    page, memory, size, ratio = CASES[index]
    got = theirs[IDS[index]]
    assert "error" not in got, got
    r = report(page, memory)
    ours = sglang_host_pools(r, ratio=ratio, size_gb=size)
    assert (ours.kv_tokens, ours.mamba_slots) == (got["kv_tokens"], got["mamba_slots"])
    assert r.pool("mamba").page_bytes == got["mamba_slot_bytes"]  # SGLang's bytes per state slot are kvpool's
    assert ours.mamba_bytes == ours.mamba_slots * got["mamba_slot_bytes"]


def test_the_size_is_split_not_doubled() -> None:
    """0.5.23 shares --hicache-size between the KV and Mamba host pools by device
    bytes: together they stay within the size (plus a padding page each)."""
    r = report(16, 16 << 20)
    pools = sglang_host_pools(r, size_gb=0.2)
    pad = r.pool("full").page_bytes + r.pool("mamba").page_bytes
    assert pools.bytes <= 0.2e9 + pad and pools.mamba_slots > 1 and pools.kv_tokens > 16
    with pytest.raises(LimitsError, match="positive"):
        sglang_host_pools(r, ratio=0)
