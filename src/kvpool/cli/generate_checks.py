"""Input checks of `kvpool generate` that need the model or torch: each raises
`KvpoolError` with one line saying what to change."""

from __future__ import annotations

from typing import Any

from kvpool.errors import KvpoolError


def check_device(torch: Any, name: str) -> None:
    """One clear line for a device this torch build cannot use."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise KvpoolError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise KvpoolError(f"--device {name}: this torch build sees no CUDA device; use --device cpu")


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
