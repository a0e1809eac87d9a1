"""KV storage: one torch tensor per pool group, shaped from the `PoolPlan`.

Group g's tensor is [pages, layers_in_g, 2 (K, V), tpb, kv_heads, head_dim]:
page-major, so one page of the plan is one contiguous slab of `page_bytes`
holding every layer of the group, exactly as the planner counted it. The bytes
allocated equal the plan's bytes; the constructor asserts it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvpool.media import Medium
from kvpool.plan import PoolPlan
from kvpool.torch_engine.arch import ArchConfig, EngineError


class KVStore:
    """Page pools of one model on one device. `layer(i)` is layer i's view
    [pages, 2, tpb, kv_heads, head_dim] into its group's tensor."""

    def __init__(self, plan: PoolPlan, cfg: ArchConfig, dtype: torch.dtype, device: torch.device | str = "cpu"):
        spec = plan.spec
        check_windows(cfg.windows, plan)
        self.plan = plan
        self.tensors: dict[str, torch.Tensor] = {}
        self.group_of_layer: dict[int, str] = {}
        self._views: dict[int, torch.Tensor] = {}
        for group in spec.groups:
            if not group.rule.dense_rows:  # compressed rows and recurrent state are not modelled
                raise EngineError(f"group {group.name}: {group.kind} state is not stored by the reference engine")
            pages = plan.pages(group.name)
            shape = (pages, len(group.layers), 2, group.tokens_per_block, cfg.num_kv_heads, cfg.head_dim)
            tensor = torch.zeros(shape, dtype=dtype, device=device)
            allocated = tensor.numel() * tensor.element_size()
            expected = plan.group(group.name).bytes
            if allocated != expected:
                raise EngineError(
                    f"group {group.name}: {allocated} bytes allocated but the plan has {expected} "
                    f"(plan kv dtype {spec.kv_dtype}, engine dtype {dtype})"
                )
            self.tensors[group.name] = tensor
            for j, layer in enumerate(group.layers):
                self.group_of_layer[layer] = group.name
                self._views[layer] = tensor[:, j]
        missing = set(range(cfg.num_layers)) - set(self._views)
        if missing:
            raise EngineError(f"layers {sorted(missing)} have no pool group in the plan")

    def layer(self, index: int) -> torch.Tensor:
        return self._views[index]

    @property
    def total_bytes(self) -> int:
        """Bytes held by all pools (equals `plan.total_bytes`)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class HostTier:
    """The host-memory tier's bytes (`cache/tiers.py`): per group a CPU tensor
    of `slots[g]` pages shaped like the GPU pool's pages (pinned when CUDA is
    there), and the copies the manager asks for (a `TierCopies`). Counts how
    many pages went each way."""

    def __init__(self, store: KVStore, slots: Sequence[int]) -> None:
        self.store = store
        self.names = [g.name for g in store.plan.spec.groups]
        pin = torch.cuda.is_available()
        self.tensors = [
            torch.zeros((n, *store.tensors[name].shape[1:]), dtype=store.tensors[name].dtype, pin_memory=pin)
            for name, n in zip(self.names, slots, strict=True)
        ]
        self.offloaded = self.onboarded = 0

    def to_tier(self, group: int, page: int, medium: Medium, slot: int) -> None:
        self._only_host(medium)
        self.tensors[group][slot].copy_(self.store.tensors[self.names[group]][page])
        self.offloaded += 1

    def to_gpu(self, group: int, medium: Medium, slot: int, page: int) -> None:
        self._only_host(medium)
        self.store.tensors[self.names[group]][page].copy_(self.tensors[group][slot], non_blocking=True)
        self.onboarded += 1

    def between(self, group: int, src: Medium, src_slot: int, dst: Medium, dst_slot: int) -> None:
        raise EngineError(f"the reference engine keeps a host tier only, not {dst}")

    @staticmethod
    def _only_host(medium: Medium) -> None:
        if medium != Medium.CPU:
            raise EngineError(f"the reference engine keeps a host tier only, not {medium}")


def check_windows(windows: Sequence[int | None], plan: PoolPlan) -> None:
    """Refuse a plan whose spec reads a layer's sliding window as full attention
    (a window of at least the spec's max_seq_len, e.g. Mistral's 4096 = its
    max_position_embeddings) while the plan serves longer requests: past the
    window the masks would differ from the model's (transformers keeps it)."""
    longest = plan.limits.max_seq_len
    for g in plan.spec.groups:
        for layer in g.layers:
            w = windows[layer] if layer < len(windows) else None
            if w is not None and g.window is None and longest > w:
                raise EngineError(
                    f"layer {layer} has a sliding window of {w} that the spec reads as full attention, but the plan "
                    f"serves {longest} tokens: build the spec with load_model_spec(..., max_seq_len={longest})"
                )
