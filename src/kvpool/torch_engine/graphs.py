"""Decode steps on static buffers: captured and replayed as CUDA graphs on a
CUDA device, run eagerly (same buffers, same shapes, same padding rows) on CPU.

A decode step of batch size b is padded by the scheduler to a captured size B
with rows of the persistent padding dummy, so every step of size B has the
same tensor shapes once the key width is fixed: for sliding groups the window
plus the step's tokens, for full attention the step's longest span rounded up
to a power-of-two number of pages (so a graph for short requests does not read
`max_seq_len` keys per row; one graph per width bucket). Each step copies its
indices into the static buffers (keys past a row's span are masked) and
replays. All graphs share one CUDA memory pool: a step's logits are copied out
right after its replay, so one graph's outputs never need to outlive the next.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kvpool.plan.limits import ServingLimits
from kvpool.spec import ModelSpec
from kvpool.torch_engine.attention import GroupIndex, PagedBatch, Row, StepIndex
from kvpool.torch_engine.kv_store import KVStore
from kvpool.torch_engine.model import DecoderLM


class _Static:
    """Static buffers and (on CUDA) the captured graph of one (B, tokens per
    row, full-attention key width) shape."""

    def __init__(
        self, spec: ModelSpec, limits: ServingLimits, device: torch.device, rows: int, per_row: int, full_width: int
    ):
        dev = device
        t = rows * per_row
        self.rows, self.per_row = rows, per_row
        self.ids = torch.zeros(t, dtype=torch.long, device=dev)
        self.positions = torch.zeros(t, dtype=torch.long, device=dev)
        self.row_index = torch.arange(rows, device=dev).repeat_interleave(per_row)
        self.col_index = torch.arange(per_row, device=dev).repeat(rows)
        self.index: dict[str, GroupIndex] = {}
        for g in spec.groups:
            bounded = g.rule.key_span(g, per_row)  # None: grows with the sequence
            span = full_width if bounded is None else bounded
            width = -(-min(span, limits.max_seq_len) // g.tokens_per_block) * g.tokens_per_block
            self.index[g.name] = GroupIndex(
                write_pages=torch.zeros(t, dtype=torch.long, device=dev),
                write_offsets=torch.zeros(t, dtype=torch.long, device=dev),
                read_pages=torch.zeros(rows, width, dtype=torch.long, device=dev),
                read_offsets=torch.zeros(rows, width, dtype=torch.long, device=dev),
                mask=torch.zeros(rows, 1, per_row, width, dtype=torch.bool, device=dev),
            )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def load(self, batch: PagedBatch, ids: list[int]) -> bool:
        """Copy one step into the buffers; False if a span is wider than captured."""
        for name, ix in batch.groups.items():
            static = self.index[name]
            width = ix.read_pages.shape[1]
            if width > static.read_pages.shape[1]:
                return False
            static.write_pages.copy_(ix.write_pages)
            static.write_offsets.copy_(ix.write_offsets)
            static.read_pages.zero_()
            static.read_offsets.zero_()
            static.mask.zero_()
            static.read_pages[:, :width].copy_(ix.read_pages)
            static.read_offsets[:, :width].copy_(ix.read_offsets)
            static.mask[..., :width].copy_(ix.mask)
        self.ids.copy_(torch.as_tensor(ids, dtype=torch.long))
        self.positions.copy_(batch.positions)
        return True

    def forward(self, model: DecoderLM, store: KVStore) -> torch.Tensor:
        cfg = model.cfg
        batch = StepIndex(self.rows, self.per_row, self.row_index, self.col_index, self.index)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return batch.attend(
                store.group_of_layer[layer], store.layer(layer), q, k, v, cfg.attn_scale, cfg.attn_logit_softcap
            )

        logits: torch.Tensor = model(self.ids, self.positions, attend)
        return logits


class DecodeGraphs:
    """Per (padded batch size, tokens per row): static buffers, captured lazily
    on first use as a CUDA graph when the device is CUDA. Takes what a decode
    step needs (model, KV store, spec, limits, pages per group), not the engine."""

    def __init__(
        self, model: DecoderLM, store: KVStore, spec: ModelSpec, limits: ServingLimits, num_pages: Mapping[str, int]
    ):
        self.model, self.store, self.spec, self.limits = model, store, spec, limits
        self.num_pages = dict(num_pages)
        self.device = model.device
        self.shapes: dict[tuple[int, int, int], _Static] = {}
        self.use_cuda = self.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.use_cuda else None
        tpb = spec.tokens_per_block
        self.max_width = -(-limits.max_seq_len // tpb) * tpb
        # groups whose keys grow with the sequence get the bucketed width
        self.full_groups = [g.name for g in spec.groups if g.rule.key_span(g, 1) is None]

    def width_bucket(self, need: int) -> int:
        """Full-attention key width of the graph for a step that reads `need`
        keys: a power-of-two number of pages, at most `max_seq_len` rounded up."""
        width = self.spec.tokens_per_block
        while width < need:
            width *= 2
        return min(width, self.max_width)

    def run(self, rows: list[Row], ids: list[int], wanted: list[int]) -> torch.Tensor | None:
        """Logits of `wanted` flat tokens, or None when this step's shape does
        not fit static buffers (ragged draft lengths, a span wider than captured)."""
        per_row = rows[0].num_tokens
        if any(r.num_tokens != per_row for r in rows):
            return None
        batch = PagedBatch(rows, self.spec.groups, self.num_pages, self.device)
        need = max((batch.groups[g].read_pages.shape[1] for g in self.full_groups), default=0)
        key = (len(rows), per_row, self.width_bucket(need))
        static = self.shapes.get(key) or self.shapes.setdefault(key, _Static(self.spec, self.limits, self.device, *key))
        if not static.load(batch, ids):
            return None
        if not self.use_cuda:
            logits = static.forward(self.model, self.store)
        else:
            if static.graph is None:
                self._capture(static)
            assert static.graph is not None and static.logits is not None
            static.graph.replay()
            logits = static.logits
        return logits[torch.tensor(wanted, dtype=torch.long, device=logits.device)]

    def _capture(self, static: _Static) -> None:
        # Warm up on a side stream (allocator, lazy kernels), then capture. The
        # capture writes K/V into the rows' current pages: those are the pages
        # this very step writes anyway, so capturing changes nothing visible.
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            static.forward(self.model, self.store)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static.logits = static.forward(self.model, self.store)
        static.graph = graph
