"""Input checks of `kvpool generate` that need the model or torch: each raises
`KvpoolError` with one line saying what to change."""

from __future__ import annotations

import os
from typing import Any

from kvpool.errors import KvpoolError
from kvpool.units import format_bytes


def check_device(torch: Any, name: str) -> None:
    """One clear line for a device this torch build cannot use."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise KvpoolError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cpu":
        return
    if device.type == "meta":  # tensors without data: nothing could be generated
        raise KvpoolError(f"--device {name}: meta tensors hold no data; use --device cpu or cuda")
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu
    if backend is None or not hasattr(backend, "is_available") or not backend.is_available():
        raise KvpoolError(f"--device {name}: this torch build sees no {device.type} device; use --device cpu")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if device.index is not None and device.index >= count:
        raise KvpoolError(f"--device {name}: there are {count} {device.type} devices (0 to {count - 1})")


def check_positions(config: dict[str, Any], prompt_len: int, max_new_tokens: int) -> None:
    """Refuse a request past the model's positions (`max_position_embeddings`),
    as the engines refuse one past `max_model_len`: beyond it RoPE runs on
    positions the model never saw, and the pages asked for can be terabytes."""
    text = config.get("text_config")
    limit = (text if isinstance(text, dict) else config).get("max_position_embeddings")
    if not isinstance(limit, int) or prompt_len + max_new_tokens <= limit:
        return
    if prompt_len > limit:
        raise KvpoolError(f"a prompt of {prompt_len} tokens is longer than the model's {limit} positions")
    raise KvpoolError(
        f"prompt {prompt_len} + --max-new-tokens {max_new_tokens} tokens pass the model's {limit} positions "
        f"(max_position_embeddings); use --max-new-tokens {limit - prompt_len} or less"
    )


def check_sizes(config: dict[str, Any], longest: int, speculate: int, tokens_per_block: int | None) -> None:
    """Refuse drafts or a page size that no request of the model can use: past its
    positions they only ask the allocator for pages (petabytes for 10**12)."""
    text = config.get("text_config")
    limit = (text if isinstance(text, dict) else config).get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return
    if longest + speculate > limit:
        raise KvpoolError(
            f"--speculate {speculate}: the longest request ({longest} tokens) plus its drafts passes the "
            f"model's {limit} positions; use --speculate {max(limit - longest, 0)} or less"
        )
    if tokens_per_block is not None and tokens_per_block > limit:
        raise KvpoolError(
            f"--tokens-per-block {tokens_per_block} is more than the model's {limit} positions; use a page "
            "size such as 16 or 32"
        )


def check_memory(torch: Any, device: str, kv_bytes: int, text: str) -> None:
    """Refuse a --kv-memory this machine cannot hold: more than the device's memory
    (the host's RAM for cpu). The engine allocates the pools whole, so 1000 TiB ran
    out of memory after seconds instead of being refused."""
    where = torch.device(device)
    if where.type == "cuda":
        held = int(torch.cuda.get_device_properties(where.index or 0).total_memory)
    elif where.type == "cpu":
        held = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        return
    if kv_bytes > held:
        raise KvpoolError(
            f"--kv-memory {text} is more than this machine's {where.type} memory ({format_bytes(held)}); "
            "give a budget that fits"
        )
