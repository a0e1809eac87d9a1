"""A sparse mixture-of-experts MLP, Mixtral's and Qwen3-MoE's routing: a linear
router over `num_experts`, softmax in float32, the top `experts_per_token`
experts per token, their weights renormalised to sum to one (Mixtral always;
Qwen3-MoE when `norm_topk_prob`), each chosen expert a SwiGLU MLP of
`moe_intermediate_size`, outputs summed with those weights.

Parameter names and shapes follow transformers 5's Mixtral and Qwen3-MoE checkpoints
(`mlp.gate.weight` [E, H], `mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]), so its state dict loads as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpool.torch_engine.arch import ArchConfig, EngineError


class Experts(nn.Module):
    """Every expert's weights as two 3-D tensors."""

    def __init__(self, cfg: ArchConfig):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.zeros(e, h, i))

    def run(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Expert `expert`'s SwiGLU MLP on tokens x [N, H]."""
        gate, up = F.linear(x, self.gate_up_proj[expert]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[expert])


class SparseMoE(nn.Module):
    """Top-k routed experts in place of the dense MLP (tokens flat: [T, H])."""

    def __init__(self, cfg: ArchConfig):
        super().__init__()
        if cfg.activation != "silu" or not 0 < cfg.experts_per_token <= cfg.num_experts:
            raise EngineError(
                f"MoE with activation {cfg.activation!r}, top {cfg.experts_per_token} of "
                f"{cfg.num_experts} experts is not supported by the reference engine"
            )
        self.top_k, self.renormalise = cfg.experts_per_token, cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, summing to 1 when renormalised, expert ids [T, k]) per token."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        return (weights / weights.sum(dim=-1, keepdim=True) if self.renormalise else weights), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            token, slot = torch.where(chosen == expert)
            y = self.experts.run(int(expert), x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out
