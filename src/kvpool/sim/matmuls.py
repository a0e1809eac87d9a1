"""The matrix multiplies of one step, per tensor-parallel rank: what the
linear-layer cost of the step-time model (`sim/kernels.py`) is summed over.

Shapes come from `models.params.matrices(config)` (every weight tensor of the
text decoder, named as in the checkpoint). Per rank, as vLLM shards them
(column-parallel q/k/v, gate/up, experts' gate/up: output rows split tp ways;
row-parallel o and down: input columns split; MLA's q_a / kv_a projections and
the V3.2 indexer replicated; lm_head vocab-parallel). Norms, biases, sinks,
routers' bias vectors are not matrix multiplies and are left to the
elementwise cost. Routed experts (`count` > 1) are kept apart: a step touches
only some of them (`Shapes.touched_experts`).

A config `matrices` does not know (no `model_type`, or a family without a
formula) falls back to its attention fields for q/k/v/o and to the rank's
parameter counts for the rest (`_fallback`): the shapes of the MLP and the
experts are then rough, their parameter counts, which set the memory-bound
time, exact.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.models.params import Matrix, ParameterCountError, matrices

_ROW_PARALLEL = re.compile(r"\.(o_proj|down_proj|w2|out_proj)(\.weight)?$|experts\.down_proj$")
_REPLICATED = re.compile(r"\.(q_a_proj|kv_a_proj_with_mqa|indexer\.[a-z_]+|gate|router)\.weight$")
_LAYER = re.compile(r"(?:^|\.)layers\.\d+\.")


@dataclass(frozen=True)
class Gemm:
    """`count` multiplies of (tokens x k) by (k x n) on one rank per step."""

    k: int
    n: int
    count: int = 1

    @property
    def params(self) -> int:
        return self.k * self.n * self.count


@dataclass(frozen=True)
class Shapes:
    """A rank's multiplies: dense ones (every token passes through them), one
    routed expert's multiplies per MoE layer (`experts` of them there, `top_k`
    per token, in `moe_layers` layers), and the lm_head (rows that sample)."""

    hidden: int
    dense: tuple[Gemm, ...]
    expert: tuple[Gemm, ...]
    experts: int
    top_k: int
    moe_layers: int
    lm_head: Gemm

    @property
    def dense_params(self) -> int:
        return sum(g.params for g in self.dense)

    def touched_experts(self, tokens: float) -> float:
        """Expected distinct experts `tokens` tokens route to (each picks top_k of
        the experts independently: 1 - (1 - k/E)^T of them)."""
        if not self.experts:
            return 0.0
        return float(self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** max(tokens, 0.0)))


def _per_rank(name: str, rows: int, cols: int, tp: int) -> tuple[int, int]:
    """(k, n) of a weight of `rows` x `cols` (out x in) on one of `tp` ranks."""
    if tp == 1 or _REPLICATED.search(name):
        return cols, rows
    if _ROW_PARALLEL.search(name):
        return -(-cols // tp), rows
    return cols, -(-rows // tp)


def per_rank_counts(
    mats: Sequence[Matrix], tp: int
) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]], int, set[str]]:
    """How many multiplies of each per-rank (k, n) the layers' weight matrices
    make, dense and one routed expert's per MoE layer apart (norms, vectors,
    embeddings skipped); the experts per MoE layer, and the MoE layers' names."""
    dense: Counter[tuple[int, int]] = Counter()
    expert: Counter[tuple[int, int]] = Counter()
    experts = 0
    moe_layers: set[str] = set()
    for m in mats:
        if m.cols <= 1 or not _LAYER.search(m.name) or "norm" in m.name:
            continue
        k, n = _per_rank(m.name, m.rows, m.cols, tp)
        if m.count > 1:
            expert[(k, n)] += 1
            experts = m.count
            moe_layers.add(m.name.split(".experts")[0])
        else:
            dense[(k, n)] += 1
    if expert:
        # one routed expert's multiplies per MoE layer
        layers = len(moe_layers)
        expert = Counter({s: c // max(layers, 1) for s, c in expert.items()})
    return dense, expert, experts, moe_layers


def model_shapes(
    config: Mapping[str, Any],
    tp: int,
    *,
    total_params: float,
    active_params: float,
    experts: int | None = None,
    top_k: int | None = None,
) -> Shapes:
    """The per-rank multiplies of `config` at tensor parallelism `tp`. The
    parameter counts (one rank's) size the fallback of a family `matrices`
    does not know."""
    hidden = int(config.get("hidden_size") or 4096)
    vocab = int(config.get("vocab_size") or 32000)
    lm_head = Gemm(hidden, -(-vocab // tp))
    try:
        mats = matrices(config)
    except (ParameterCountError, KeyError, TypeError, ValueError):
        return _fallback(config, tp, lm_head, total_params, active_params, experts, top_k)
    dense, expert, experts, moe_layers = per_rank_counts(mats, tp)
    k_top = top_k or int(config.get("num_experts_per_tok") or config.get("experts_per_token") or 0)
    return Shapes(
        hidden,
        tuple(Gemm(k, n, c) for (k, n), c in sorted(dense.items())),
        tuple(Gemm(k, n, c) for (k, n), c in sorted(expert.items())),
        experts,
        min(k_top, experts) if experts else 0,
        len(moe_layers),
        lm_head,
    )


def attention_gemms(config: Mapping[str, Any], h: int, tp: int, layers: int) -> list[Gemm]:
    """q, k and v, and o of `layers` layers on one of `tp` ranks, from the config's head counts."""
    heads = int(config.get("num_attention_heads") or 1)
    kv = int(config.get("num_key_value_heads") or heads)
    d = int(config.get("head_dim") or h // heads)
    q_out, kv_out = -(-heads * d // tp), -(-kv * d // tp)
    return [Gemm(h, q_out, layers), Gemm(h, kv_out, 2 * layers), Gemm(q_out, h, layers)]


def routed_expert(h: int, layers: int, total: float, active: float, e: int, k: int) -> tuple[tuple[Gemm, ...], float]:
    """One routed expert's gate, up and down (each (total - active) / (e - k)
    parameters per layer, split in three) and the parameters of the `k` routed
    per token; none where the counts show no routed experts."""
    if e > k > 0 and total > active:
        per_expert = (total - active) / (e - k) / layers
        return (Gemm(h, max(int(per_expert / 3 / h), 1), 3),), k * per_expert * layers
    return (), 0.0


def _fallback(
    config: Mapping[str, Any],
    tp: int,
    lm_head: Gemm,
    total: float,
    active: float,
    experts: int | None,
    top_k: int | None,
) -> Shapes:
    """Shapes from the config's attention fields and the rank's parameter
    counts: attention q/k/v/o exact; each routed expert (total - active) /
    (E - k) parameters per rank as gate, up and down of equal size; the rest
    of the active parameters (less embeddings and lm_head) as a dense MLP."""
    h = lm_head.k
    layers = max(int(config.get("num_hidden_layers") or 1), 1)
    attention = attention_gemms(config, h, tp, layers)
    attn_params = sum(g.params for g in attention)
    embed = 2 * lm_head.params
    e, k = experts or 0, top_k or 0
    expert, routed = routed_expert(h, layers, total, active, e, k)
    rest = (active - routed - embed - attn_params) / layers
    mlp = [Gemm(h, int(rest / 3 / h), 3 * layers)] if rest > 3 * h else []
    return Shapes(
        h, tuple(attention + mlp), expert, e if expert else 0, k if expert else 0, layers if expert else 0, lm_head
    )


__all__ = ["Gemm", "Shapes", "model_shapes"]
