"""Pipeline parallelism: which layers one rank keeps. Every stage holds the
same requests on a GPU of the same size, so the stage whose layers need the
most KV bytes is the one that limits a deployment: kvpool plans that stage
(per rank, as it plans one tensor-parallel rank)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.spec.families import LayerCache
from kvpool.spec.groups import LayerGroup
from kvpool.spec.pages import REFERENCE_REQUEST, pages_needed


def busiest_stage(
    caches: Sequence[LayerCache],
    num_layers: int,
    pp_size: int,
    build: Callable[[list[LayerCache]], tuple[LayerGroup, ...]],
) -> tuple[int, list[LayerCache]]:
    """(stage index, that stage's caches) of the stage whose groups (`build`)
    need the most bytes for the reference request; stages split the decoder
    layers as vLLM's `get_pp_indices` does (`models.weights.stage_layers`).
    The first such stage wins a tie."""
    from kvpool.models.weights import stage_layers  # here: one stage (no --pp) loads no weights' module

    best: tuple[int, int, list[LayerCache]] | None = None
    for index, layers in enumerate(stage_layers(num_layers, pp_size)):
        mine = [c for c in caches if c.layer in layers]
        groups = build(mine)
        need = sum(pages_needed(g, *REFERENCE_REQUEST) * g.slot_bytes for g in groups)
        if best is None or need > best[0]:
            best = (need, index, mine)
    assert best is not None  # stage_layers gives at least one stage
    return best[1], best[2]
