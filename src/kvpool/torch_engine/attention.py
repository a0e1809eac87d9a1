"""Attention over kvpool pages in plain PyTorch.

One engine step is a ragged batch: row r holds `num_tokens` query tokens at
positions `start .. start+num_tokens-1` of one sequence (a prefill chunk, or a
decode token plus its drafts). Each layer first writes the rows' new K/V into
the pages the block tables name, then gathers every row's visible keys back
through the same tables and runs masked attention. The masks are the usual
ones: causal, sliding(W) (a query at q sees keys k with q - W < k <= q, as
transformers does) and chunked(C) (keys in the query's chunk).

A position the attention must read but whose page is stale or missing raises
`StalePageError`: a page released one step too early cannot go unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kvpool.spec import LayerGroup, kind_rule
from kvpool.torch_engine.arch import StalePageError


@dataclass(frozen=True)
class Row:
    """One sequence's share of a step: `num_tokens` queries from position
    `start` (= its history), and its block table in every group."""

    start: int
    num_tokens: int
    tables: Mapping[str, np.ndarray]


def visible_start(group: LayerGroup, position: int) -> int:
    """First key position a query at `position` attends to in `group` (its kind rule)."""
    return max(0, int(group.rule.first_visible(group, position)))


@dataclass(frozen=True)
class _Window:
    """The part of a group a mask needs (the `spec.kinds.Life` protocol)."""

    window: int | None
    name: str = "mask"
    tokens_per_block: int = 1
    ratio: int | None = None


def attention_mask(kind: str, window: int | None, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Boolean [.., Q, K] mask of which keys each query sees (True = attend)
    for a `kind` of layer (full, sliding, chunked) with `window` W or C: causal,
    and from the kind rule's first visible position on."""
    q, k = q_pos[..., :, None], k_pos[..., None, :]
    first = kind_rule(kind).first_visible(_Window(window), q)
    mask: torch.Tensor = (k <= q) & (k >= first)
    return mask


@dataclass
class GroupIndex:
    """Where one group's layers write this step's K/V and what they read back."""

    write_pages: torch.Tensor  # [T]
    write_offsets: torch.Tensor  # [T]
    read_pages: torch.Tensor  # [R, K]
    read_offsets: torch.Tensor  # [R, K]
    mask: torch.Tensor  # [R, 1, Q, K]


class StepIndex:
    """What every layer's attention reads in one step: the token -> (row,
    column) placement and one `GroupIndex` per pool group. `PagedBatch`
    builds one from block tables; `engine.graphs` points one at its static
    buffers."""

    def __init__(
        self,
        num_rows: int,
        max_queries: int,
        row_index: torch.Tensor,
        col_index: torch.Tensor,
        groups: dict[str, GroupIndex],
    ) -> None:
        self.num_rows, self.max_queries = num_rows, max_queries
        self.row_index, self.col_index, self.groups = row_index, col_index, groups

    def attend(
        self,
        group: str,
        kv: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Write this step's `k`, `v` ([T, kv_heads, dim]) into `kv` (one layer's
        pages: [pages, 2, tpb, kv_heads, dim]; side effect), then attend `q`
        ([T, heads, dim]) to every visible key. Returns [T, heads, dim]."""
        ix = self.groups[group]
        # K and V together: one scatter and one gather per layer, not two each.
        kv[ix.write_pages, :, ix.write_offsets] = torch.stack((k, v), dim=1)
        both = kv[ix.read_pages, :, ix.read_offsets]  # [R, K, 2, kvh, d]
        keys, values = both[:, :, 0], both[:, :, 1]
        if self.max_queries == 1:  # decode only: token i is row i, nothing to scatter
            return scaled_attention(q[:, None], keys, values, ix.mask, scale, softcap)[:, 0]
        queries = q.new_zeros(self.num_rows, self.max_queries, *q.shape[1:])
        queries[self.row_index, self.col_index] = q
        out = scaled_attention(queries, keys, values, ix.mask, scale, softcap)
        return out[self.row_index, self.col_index]


class PagedBatch(StepIndex):
    """Per-step metadata, built once and shared by every layer: flat token
    positions, the token -> (row, column) placement, and one `GroupIndex` per
    pool group. Raises `StalePageError` if a needed page is not in a table."""

    def __init__(
        self,
        rows: Sequence[Row],
        groups: Sequence[LayerGroup],
        num_pages: Mapping[str, int],
        device: torch.device | str = "cpu",
    ):
        self.rows = list(rows)
        starts = np.array([r.start for r in rows], dtype=np.int64)
        counts = np.array([r.num_tokens for r in rows], dtype=np.int64)
        self.max_queries = int(counts.max())
        self.q_row = np.repeat(np.arange(len(rows)), counts)
        self.q_col = np.concatenate([np.arange(c) for c in counts])
        self.positions_np = starts[self.q_row] + self.q_col
        # The last token of each row: where a prefill or a plain decode samples.
        self.last_index = np.cumsum(counts) - 1
        q_pos = np.full((len(rows), self.max_queries), -1, dtype=np.int64)
        q_pos[self.q_row, self.q_col] = self.positions_np
        self.device = torch.device(device)
        self.positions = torch.from_numpy(self.positions_np).to(self.device)
        super().__init__(
            len(rows),
            self.max_queries,
            torch.from_numpy(self.q_row).to(self.device),
            torch.from_numpy(self.q_col).to(self.device),
            {g.name: self._group_index(g, num_pages[g.name], q_pos) for g in groups},
        )

    def _group_index(self, group: LayerGroup, num_pages: int, q_pos: np.ndarray) -> GroupIndex:
        tpb = group.tokens_per_block
        write_pages = np.empty(len(self.positions_np), dtype=np.int64)
        spans = []
        offset = 0
        for r, row in enumerate(self.rows):
            end = row.start + row.num_tokens
            lo = visible_start(group, row.start)
            table = np.asarray(row.tables[group.name], dtype=np.int64)
            k_pos = np.arange(lo, end)
            idx = k_pos // tpb
            if len(idx) and idx[-1] >= len(table):
                raise StalePageError(
                    f"group {group.name} row {r}: position {end - 1} needs page {idx[-1]}, "
                    f"but the block table has {len(table)} pages"
                )
            pages = table[idx]
            bad = (pages < 0) | (pages >= num_pages)
            if bad.any():
                raise StalePageError(
                    f"group {group.name} row {r}: positions {k_pos[bad][:4].tolist()} are visible to "
                    f"queries from position {row.start} but their pages {sorted(set(idx[bad].tolist()))} "
                    f"are released (table {table.tolist()})"
                )
            write_pages[offset : offset + row.num_tokens] = pages[len(pages) - row.num_tokens :]
            offset += row.num_tokens
            spans.append((k_pos, pages))
        width = max(len(k) for k, _ in spans)
        read_pages = np.zeros((len(self.rows), width), dtype=np.int64)
        k_pos_pad = np.full((len(self.rows), width), np.iinfo(np.int64).max, dtype=np.int64)
        for r, (k_pos, pages) in enumerate(spans):
            read_pages[r, : len(k_pos)], k_pos_pad[r, : len(k_pos)] = pages, k_pos
        read_offsets = np.where(k_pos_pad == np.iinfo(np.int64).max, 0, k_pos_pad % tpb)
        mask = attention_mask(group.kind, group.window, torch.from_numpy(q_pos), torch.from_numpy(k_pos_pad))
        mask &= torch.from_numpy(q_pos >= 0)[:, :, None]
        # Padding query slots see one key so that softmax stays finite; discarded.
        mask[:, :, 0] |= torch.from_numpy(q_pos < 0)
        dev = self.device
        return GroupIndex(
            write_pages=torch.from_numpy(write_pages).to(dev),
            write_offsets=torch.from_numpy(self.positions_np % tpb).to(dev),
            read_pages=torch.from_numpy(read_pages).to(dev),
            read_offsets=torch.from_numpy(read_offsets).to(dev),
            mask=mask[:, None].to(dev),
        )


def scaled_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None = None
) -> torch.Tensor:
    """Masked attention on [R, Q, H, D] queries and [R, K, KVH, D] keys/values
    (grouped-query heads repeated); softmax in float32. Returns [R, Q, H, D].
    Float32 without softcapping goes through torch's fused SDPA, which shares
    each key head with its query group without copying it."""
    heads, kv_heads = q.shape[2], k.shape[2]
    if softcap is None and q.dtype == torch.float32:
        fused = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=heads != kv_heads,
        )
        return fused.transpose(1, 2)
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=2)
        v = v.repeat_interleave(heads // kv_heads, dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [R, H, *, D]
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v).transpose(1, 2)


def dense_attention(
    window: int | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None = None
) -> torch.Tensor:
    """Attention of one contiguous sequence from position 0 ([S, H, D]), no
    pages: the parity baseline for the model code itself."""
    pos = torch.arange(q.shape[0], device=q.device)
    mask = attention_mask("sliding" if window else "full", window, pos, pos)[None, None]
    return scaled_attention(q[None], k[None], v[None], mask, scale, softcap)[0]
