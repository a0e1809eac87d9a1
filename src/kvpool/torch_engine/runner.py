"""The continuous-batching loop: kvpool's manager and shared scheduler drive a `DecoderLM` whose KV
lives in page pools.

Per step: the scheduler admits requests FCFS through `manager.create` (prefix reuse), picks decodes
and chunked-prefill pieces under the token budget, resizes every request (preempting by recompute
when pages run out) and pads the decode batch to a captured CUDA-graph size with the persistent
padding dummy from `manager.warmup`. The engine runs one forward over all rows (prefill chunks,
decode tokens with their drafts, padding rows), verifies drafts greedily and hands the accepted
tokens back to `scheduler.update`, which commits verified tokens and frees finished requests.
Greedy decoding only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvpool.cache import KVCacheManager, TierSpec
from kvpool.media import Medium
from kvpool.plan import PoolPlan
from kvpool.sched import Sequence as SchedSequence
from kvpool.sched import Step, session
from kvpool.torch_engine.arch import EngineError
from kvpool.torch_engine.attention import PagedBatch, Row
from kvpool.torch_engine.drafter import NgramDrafter
from kvpool.torch_engine.kv_store import HostTier, KVStore
from kvpool.torch_engine.model import DecoderLM

if TYPE_CHECKING:
    from kvpool.torch_engine.graphs import DecodeGraphs


@dataclass
class Output:
    """One finished request: its tokens, how many prompt tokens were reused
    from the prefix cache, and the logits that chose its last token."""

    rid: int
    prompt_ids: list[int]
    output_ids: list[int]
    last_logits: torch.Tensor | None = None
    num_cached: int = 0  # prompt tokens reused from the prefix cache (last admission)


@dataclass
class EngineStats:
    """Counters of one engine since construction."""

    steps: int = 0
    prefill_tokens: int = 0
    decode_rows: int = 0
    padding_rows: int = 0
    graph_steps: int = 0
    preemptions: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    peak_pages: dict[str, int] = field(default_factory=dict)


class Engine:
    """A reference serving engine over one `PoolPlan`.

    Side effects: allocates the plan's KV bytes on `device` (KVStore), runs
    `manager.warmup` for the plan's CUDA-graph batch sizes (reserving the
    padding dummies) unless `warmup=False`. `speculate=k` drafts up to k tokens
    per decode step with an n-gram drafter (greedy output unchanged).
    `host_memory` bytes add a host tier: committed pages the pools evict are
    copied there and back on a prefix hit (`HostTier`). `hash_lookahead` L:
    each page's digest also covers the L ids after it (`KVCacheManager`).
    """

    def __init__(
        self,
        model: DecoderLM,
        plan: PoolPlan,
        *,
        speculate: int = 0,
        enable_reuse: bool = True,
        padding: bool = True,
        warmup: bool = True,
        cuda_graphs: bool | None = None,
        host_memory: int = 0,
        hash_lookahead: int = 0,
    ):
        if speculate > plan.limits.max_draft_len:
            raise EngineError(f"speculate={speculate} exceeds the plan's max_draft_len {plan.limits.max_draft_len}")
        self.model, self.plan, self.spec = model, plan, plan.spec
        self.device = model.device
        self.store = KVStore(plan, model.cfg, model.dtype, self.device)
        self.manager, self.scheduler, self.warmup_report = session(
            plan,
            enable_reuse=enable_reuse,
            padding=padding,
            warmup=warmup,
            draft_lens=(0, speculate) if speculate else (0,),
            tiers=[TierSpec(Medium.CPU, host_memory)] if host_memory else (),
            hash_lookahead=hash_lookahead,
        )
        self.host: HostTier | None = None
        if host_memory:  # evicted prefix pages go to host memory and come back on a hit
            assert self.manager.tier is not None
            self.host = HostTier(self.store, self.manager.tier.pages)
            self.manager.set_tier_copies(self.host)
        self.drafter = NgramDrafter(speculate) if speculate else None
        self.stats = EngineStats(peak_pages={g.name: 0 for g in self.spec.groups})
        # called with the manager after every step of `run` (e.g. to publish its events)
        self.on_step: Callable[[KVCacheManager], None] | None = None
        self._num_pages = {g.name: plan.pages(g.name) for g in self.spec.groups}
        self._seqs: dict[int, SchedSequence] = {}
        self._outputs: dict[int, Output] = {}
        self._next_rid = 0
        self.graphs = self._decode_graphs(self.device.type == "cuda" if cuda_graphs is None else cuda_graphs)

    def _decode_graphs(self, wanted: bool) -> DecodeGraphs | None:
        """Decode steps on static buffers (captured as CUDA graphs on CUDA), when `wanted`."""
        if not wanted:
            return None
        from kvpool.torch_engine.graphs import DecodeGraphs

        return DecodeGraphs(self.model, self.store, self.spec, self.plan.limits, self._num_pages)

    # ------------------------------------------------------------------ requests

    def _check_request(self, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        """EngineError for an empty prompt, a token outside the vocabulary, or a
        request longer than the plan's max_seq_len."""
        if not prompt_ids:
            raise EngineError("a prompt needs at least one token")
        if max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be positive, got {max_new_tokens}")
        bad = [t for t in prompt_ids if not 0 <= int(t) < self.model.cfg.vocab_size]
        if bad:
            raise EngineError(f"token ids {bad[:3]} are outside the vocabulary (size {self.model.cfg.vocab_size})")
        limit = self.plan.limits.max_seq_len
        if len(prompt_ids) + max_new_tokens > limit:
            raise EngineError(
                f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) exceeds max_seq_len {limit}"
            )

    def add(
        self, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | Sequence[int] | None = None
    ) -> int:
        """Queue one request (FCFS); returns its request id. `eos_token_id`: one
        stop id or several."""
        self._check_request(prompt_ids, max_new_tokens)
        rid = self._next_rid
        self._next_rid += 1
        seq = SchedSequence(
            rid=rid,
            prompt_ids=[int(t) for t in prompt_ids],
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id
            if eos_token_id is None or isinstance(eos_token_id, int)
            else tuple(int(t) for t in eos_token_id),
        )
        self._seqs[rid] = seq
        self._outputs[rid] = Output(rid, list(seq.prompt_ids), [])
        self.scheduler.add(seq)
        return rid

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_token_id: int | Sequence[int] | None = None
    ) -> list[Output]:
        """Greedy-generate every prompt; returns outputs in prompt order and
        checks the manager's integrity (no leaked pages) at the end."""
        rids = [self.add(p, max_new_tokens, eos_token_id) for p in prompts]
        self.run()
        return [self._outputs.pop(r) for r in rids]

    def run(self) -> None:
        """Step until every queued request has finished."""
        while self.scheduler.has_work():
            if not self.step():
                raise EngineError("the pools cannot hold even one request; raise --kv-memory")
            if self.on_step is not None:
                self.on_step(self.manager)
        self.manager.check_integrity()

    # ------------------------------------------------------------------ one step

    def _drafts(self) -> dict[int, list[int]]:
        """Draft tokens for every request that is decoding now."""
        if self.drafter is None:
            return {}
        drafts = {}
        for seq in self.scheduler.running:
            if not seq.is_decoding:
                continue
            tokens = seq.all_ids
            room = seq.max_new_tokens - len(seq.output_ids) - 1
            proposal = self.drafter.propose(tokens, limit=room)
            if proposal:
                drafts[seq.rid] = proposal
        return drafts

    def _table(self, rid: int) -> dict[str, np.ndarray]:
        return {g.name: self.manager.block_table(rid, g.name) for g in self.spec.groups}

    @torch.no_grad()
    def step(self) -> bool:
        """Schedule and run one iteration. Returns False if nothing could be
        scheduled although work is queued."""
        drafts = self._drafts()
        step = self.scheduler.schedule({rid: len(d) for rid, d in drafts.items()} or None)
        if step is None:
            return False
        if step.rejected:
            seq = step.rejected[0]
            raise EngineError(
                f"request {seq.rid} ({seq.num_tokens} tokens) can never fit: {seq.finish_reason}; raise --kv-memory"
            )
        self.stats.steps += 1
        self.stats.preemptions += len(step.preempted)
        for g in self.spec.groups:  # every resize of the step is in place now: the peak
            used = self._num_pages[g.name] - self.manager.free_pages(g.name)
            self.stats.peak_pages[g.name] = max(self.stats.peak_pages[g.name], used)
        rows: list[Row] = []
        ids: list[int] = []
        # (rid, flat indices whose logits are needed, draft tokens) per sampling row
        wanted: list[tuple[int, list[int], list[int]]] = []
        for seq, start, n in step.prefills:
            tokens = seq.all_ids
            rows.append(Row(start, n, self._table(seq.rid)))
            ids += tokens[start : start + n]
            self.stats.prefill_tokens += n
            if start + n == len(tokens):
                wanted.append((seq.rid, [len(ids) - 1], []))
        for seq, k in step.decodes:
            tokens = seq.all_ids
            draft = drafts.get(seq.rid, [])[:k]
            rows.append(Row(seq.num_computed, 1 + len(draft), self._table(seq.rid)))
            first = len(ids)
            ids += [tokens[-1], *draft]
            wanted.append((seq.rid, list(range(first, len(ids))), draft))
            self.stats.decode_rows += 1
            self.stats.draft_proposed += len(draft)
        padding = self._padding_rows(step)
        rows += padding
        ids += [0] * sum(r.num_tokens for r in padding)
        logits = self._forward(rows, ids, step, [i for _, idx, _ in wanted for i in idx])
        sampled: dict[int, list[int]] = {}
        at = 0
        for rid, idx, draft in wanted:
            chosen = logits[at : at + len(idx)]
            at += len(idx)
            preds = chosen.argmax(-1).tolist()
            accepted = self._accept(self._seqs[rid], preds, draft)
            self.stats.draft_accepted += len(accepted) - 1
            sampled[rid] = accepted
            out = self._outputs[rid]
            out.last_logits = chosen[len(accepted) - 1].clone()
        finished = self.scheduler.update(step, sampled)
        for seq in finished:
            out = self._outputs[seq.rid]
            out.output_ids, out.num_cached = list(seq.output_ids), seq.num_cached
            del self._seqs[seq.rid]
        return True

    def _accept(self, seq: SchedSequence, preds: list[int], draft: list[int]) -> list[int]:
        """Greedy verification: the draft's longest prefix the model agrees
        with, then the model's own token; cut at EOS and at max_new_tokens."""
        accepted = []
        for i, token in enumerate(preds):
            accepted.append(token)
            if i >= len(draft) or token != draft[i]:
                break
        room = seq.max_new_tokens - len(seq.output_ids)
        accepted = accepted[:room]
        stops = [i for i, t in enumerate(accepted) if t in seq.stop_ids]
        if stops:
            accepted = accepted[: stops[0] + 1]
        return accepted

    def _padding_rows(self, step: Step) -> list[Row]:
        """Rows that pad the decode batch to the captured size: each reads and
        writes only the padding dummy's own pages (its in-flight position and
        the step's draft positions); their output is dropped."""
        padded, rid = step.padded_batch_size, step.padding_rid
        if not padded or rid is None or padded <= step.batch_size:
            return []
        row = Row(self.manager.history(rid), 1 + step.draft_len, self._table(rid))
        self.stats.padding_rows += padded - step.batch_size
        return [row] * (padded - step.batch_size)

    def _forward(self, rows: list[Row], ids: list[int], step: Step, wanted: list[int]) -> torch.Tensor:
        if self.graphs is not None and step.graph and not step.prefills:
            replayed = self.graphs.run(rows, ids, wanted)
            if replayed is not None:
                self.stats.graph_steps += 1
                return replayed
        batch = PagedBatch(rows, self.spec.groups, self._num_pages, self.device)
        store, cfg = self.store, self.model.cfg

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return batch.attend(
                store.group_of_layer[layer], store.layer(layer), q, k, v, cfg.attn_scale, cfg.attn_logit_softcap
            )

        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        index = torch.tensor(wanted, dtype=torch.long, device=self.device)
        logits: torch.Tensor = self.model(input_ids, batch.positions, attend, index)
        return logits

    # ------------------------------------------------------------------ report

    def kv_report(self) -> dict[str, Any]:
        """Pages used (peak, per group), reuse hits, preemptions: the `kv` part
        of `kvpool generate --json`."""
        stats = self.manager.stats()
        return {
            "pages_used": dict(self.stats.peak_pages),
            "total_pages": dict(self._num_pages),
            "reuse_hit_tokens": stats.reuse_hit_tokens,
            "preemptions": self.stats.preemptions,
            "steps": self.stats.steps,
            "draft_tokens_proposed": self.stats.draft_proposed,
            "draft_tokens_accepted": self.stats.draft_accepted,
            "padding_rows": self.stats.padding_rows,
            "graph_steps": self.stats.graph_steps,
        }
