"""What TensorRT-LLM's executor gives KV cache manager V2 besides the quota: the typical
step and constraints of the generic `KVCacheManagerV2._build_base_config` and of
DeepSeek-V4's cache manager, and DeepSeek-V4's windows (re-expressed from
`tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py` and
`deepseek_v4/cache_manager.py`, as tests/data/trtllm/README.md lists them; no
TensorRT-LLM code used). `trtllm_v2.size` sizes the pools from them.
"""

from __future__ import annotations

from kvpool.engines.trtllm_v2 import Batch, V2Options
from kvpool.errors import LimitsError
from kvpool.plan.limits import ServingLimits


def executor_batches(
    *,
    max_batch_size: int,
    max_seq_len: int,
    max_num_tokens: int | None = None,
    max_draft_len: int = 0,
    num_extra_kv_tokens: int = 0,
    avg_seq_len: int | None = None,
    pool_ratio: bool = False,
) -> tuple[Batch | None, tuple[Batch, ...]]:
    """The typical step and constraints the generic `KVCacheManagerV2._build_base_config`
    gives the core manager (B, L, N, d, E, S as TensorRT-LLM names them):

    - no `avg_seq_len` (the default) or a `pool_ratio`: none (the allocator fallback);
    - typical step `[(N or S) + E, 0]` then `(B - 1) x [S, max(0, S - d - 1)]`;
    - constraints `[L, L - 1] + (B - 1) x [1 + d + E, 0]` (CUDA-graph warmup) and
      `[N + E, 0]` when N is set (one chunk of context).
    """
    if pool_ratio or avg_seq_len is None:
        return None, ()
    s, n, e = avg_seq_len, max_num_tokens, num_extra_kv_tokens
    if s > max_seq_len:
        raise LimitsError(f"avg_seq_len ({s}) must be less than or equal to max_seq_len ({max_seq_len})")
    decode = (s, max(0, s - max_draft_len - 1))
    typical = ((n if n is not None else s) + e, 0), *[decode] * (max_batch_size - 1)
    warmup = ((max_seq_len, max_seq_len - 1), *[(1 + max_draft_len + e, 0)] * (max_batch_size - 1))
    constraints = (warmup,) if n is None else (warmup, ((n + e, 0),))
    return typical, constraints


def deepseek_v4_batches(
    *,
    max_batch_size: int,
    max_seq_len: int,
    max_num_tokens: int | None = None,
    max_draft_len: int = 0,
    avg_seq_len: int | None = None,
) -> tuple[Batch, tuple[Batch, ...]]:
    """DeepSeek-V4's cache manager always builds them (S = avg_seq_len or L): typical step
    `[N or S, 0]` then `(B - 1) x [S, max(0, S - d - 1)]`; constraints `[L, L - 1]` and
    `[N, 0]` when N is set."""
    s = max_seq_len if avg_seq_len is None else avg_seq_len
    if s > max_seq_len:
        raise LimitsError(f"avg_seq_len ({s}) must be less than or equal to max_seq_len ({max_seq_len})")
    n = max_num_tokens
    typical = ((n if n is not None else s, 0), *[(s, max(0, s - max_draft_len - 1))] * (max_batch_size - 1))
    longest: Batch = ((max_seq_len, max_seq_len - 1),)
    return typical, ((longest,) if n is None else (longest, ((n, 0),)))


def options_for(
    limits: ServingLimits, *, avg_seq_len: int | None = None, max_tokens: int | None = None, sink_tokens: int = 0
) -> V2Options:
    """V2's options for a deployment whose `KvCacheConfig` sets `avg_seq_len` (and
    `max_tokens`, `sink_token_length`): the executor's typical step and constraints
    from B, L, N, d and E of `limits`."""
    typical, constraints = executor_batches(
        max_batch_size=limits.max_batch_size,
        max_seq_len=limits.max_seq_len,
        max_num_tokens=limits.max_num_tokens,
        max_draft_len=limits.max_draft_len,
        num_extra_kv_tokens=limits.num_extra_kv_tokens,
        avg_seq_len=avg_seq_len,
    )
    return V2Options(
        typical_step=typical,
        constraints=constraints,
        sink_tokens=sink_tokens,
        max_tokens=max_tokens,
        max_num_tokens=limits.max_num_tokens if max_tokens is not None else None,
        max_batch_size=limits.max_batch_size,
    )


DSV4_SPARSE_RATIO = 4  # the overlapping compressor keeps 2 x ratio tokens of state


def deepseek_v4_window(role: str, compress_ratio: int, swa_window: int, max_draft_len: int) -> int | None:
    """The window DeepSeek-V4's cache manager gives a role (`_get_window_size`): the SWA
    cache `W + d`, a compressor's state `state_factor x ratio + d` (state_factor 2 for the
    overlapping ratio-4 compressor, else 1), the compressed cache itself none (full)."""
    if role == "swa":
        return swa_window + max_draft_len
    if role == "compressor":
        return (2 if compress_ratio == DSV4_SPARSE_RATIO else 1) * compress_ratio + max_draft_len
    if role == "compress":
        return None
    raise LimitsError(f"unknown DeepSeek-V4 cache role {role!r}; roles: swa, compressor, compress")
