"""The shared scheduler: FCFS admission, chunked prefill, preemption (by recompute, or by
suspension to a cold tier), and padding of
decode batches to captured CUDA-graph sizes. The engine and the simulator both drive it, so both
apply the same rules to the same `KVCacheManager`. Every page count comes from the manager (`create`,
`resize`, `commit`, `free`, `add_dummy_requests`); the scheduler only decides which request gets how
many positions. See docs/sched.md.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Literal, NamedTuple, cast

from kvpool.cache.checks import INT64_MAX
from kvpool.cache.results import CreateCheck
from kvpool.plan.limits import ServingLimits
from kvpool.sched.admission import Admission
from kvpool.sched.chunks import ChunkSizer
from kvpool.sched.commits import PageCommits
from kvpool.sched.padding import GraphPadding
from kvpool.sched.paged_cache import PagedCache, SuspendingCache
from kvpool.sched.sequence import (
    SchedulerError,
    Sequence,
    Status,
    append_tokens,
    check_request,
    check_sampled,
    decoding_of,
)
from kvpool.sched.step import Step


class Blocked(NamedTuple):
    """The head of the queue that the last `schedule` found no pages for
    (optimistic admission), and the manager's answer (None where a pool had
    no page to give, so that the manager was not asked). It waits until running
    requests free pages; decode steps that take no more than its `spare`
    pages leave its hit as it is and fewer pages free, so they leave it
    waiting (`sched.runs` runs them at once)."""

    seq: Sequence
    check: CreateCheck | None  # None: not asked, a pool it needs a page of has none (`Scheduler.no_room`)

    @property
    def spare(self) -> Mapping[str, int]:
        """`check.spare`: pages per pool that allocations may take and leave
        the head as short as it is. Empty when not asked: a pool of a group
        whose pages grow had no page at all (it spares none, so the first page
        a decode step takes there is one more than spared, whatever the others spare)."""
        return {} if self.check is None else self.check.spare


def checked_ids(check: CreateCheck | None, ids: array[int]) -> array[int]:
    """The ids `check` answered about, as the manager checked them
    (`CreateCheck.ids`), for asking about `ids` again: the manager takes the
    ids it kept as they are, where it would compare `ids` with them first. `ids`
    themselves when it kept none (or they differ in length: a request's ids
    do not change while it waits, but a check of other ids is not taken)."""
    kept = None if check is None else check.ids
    return ids if kept is None or len(kept) != len(ids) else kept


class Scheduler:
    """Decides each iteration's batch and keeps the manager's pages in step with it.

    `captured`: the (batch size, draft length) CUDA-graph shapes warmup captured (None: every
    `limits.graph_batch_sizes` size with draft length 0). `padding_rids`: the persistent padding
    dummy per draft length that warmup reserved. With `padding=False` it emulates engines that
    allocate the padding dummy lazily: a fresh one-token dummy in each padded step, freed after
    the step; when the pool is full that fails and the step runs eagerly (`sched.session` wires it).
    `admission`: how much of its future a request must find room for to be admitted
    (`sched/admission.py`; default optimistic, vLLM's rule).

    `preemption`: what happens to a victim when pages run out. "recompute" (default) frees its
    pages and queues it first to be computed again. "suspend" (needs a manager with a cold tier,
    `SuspendingCache`) parks its pages in the tier (`manager.suspend`) and keeps its computed
    positions; each `schedule` first resumes the suspended requests, oldest first, while the batch
    has room and the manager agrees, before anything new is admitted; a victim no tier has room
    for is recomputed. TensorRT-LLM's KV cache manager V2 suspends and resumes requests the same
    way; vLLM's v0 scheduler had it as its SWAP preemption mode. `num_suspensions`,
    `suspended_pages` and `resumed_pages` count what suspension did.
    """

    def __init__(
        self,
        manager: PagedCache,
        limits: ServingLimits,
        *,
        padding: bool = True,
        captured: Iterable[tuple[int, int]] | None = None,
        padding_rids: Mapping[int, int] | None = None,
        enable_reuse: bool = True,
        admission: Admission | None = None,
        preemption: Literal["recompute", "suspend"] = "recompute",
    ) -> None:
        if preemption not in ("recompute", "suspend"):
            raise SchedulerError(f"preemption must be 'recompute' or 'suspend', not {preemption!r}")
        self.manager, self.limits = manager, limits
        self.preemption = preemption
        # suspend mode drives the manager's suspend / resume, beyond the `PagedCache` protocol
        self.tiered = cast(SuspendingCache, manager) if preemption == "suspend" else None
        self.suspended: deque[Sequence] = deque()  # oldest first
        self.num_suspensions = 0
        self.suspended_pages = 0
        self.resumed_pages = 0
        self.admission = admission or Admission.named("optimistic", ())
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is preempted first
        shapes = captured if captured is not None else [(b, 0) for b in limits.graph_batch_sizes]
        self.graphs = GraphPadding(manager, shapes, padding_rids, reserved=padding)
        self.num_preemptions = 0
        self._step_prefills: list[tuple[Sequence, int, int]] = []
        self._step_decodes: list[tuple[Sequence, int]] = []
        self._preempted: list[Sequence] = []
        self._rejected: list[Sequence] = []
        self._rids: set[int] = set()
        self.commits = PageCommits(manager, enable_reuse)  # the ids handed to the manager, its pages offered
        self.blocked: Blocked | None = None  # the head of the queue waits for pages (the last `schedule`)
        self._asked: tuple[Sequence, CreateCheck] | None = None  # the last head asked of the manager, its answer
        # groups in which any request opens a page after its prefix hit (whole pages of the spec's size)
        tpb = manager.spec.tokens_per_block
        self._opening = tuple(
            g.name for g in manager.spec.groups if not g.rule.per_request and tpb % g.tokens_per_block == 0
        )
        self.chunks = ChunkSizer(manager, limits.num_extra_kv_tokens)  # each prefill chunk's length

    @property
    def enable_reuse(self) -> bool:
        """Whether requests reuse cached prefixes and offer their pages (`PageCommits`)."""
        return self.commits.enable_reuse

    # ------------------------------------------------------------------ queue

    def add(self, seq: Sequence) -> None:
        """Queue a request (FCFS). Raises SchedulerError for an empty prompt, a
        prompt of at least `max_seq_len` tokens, or a duplicate rid."""
        check_request(seq, self.limits.max_seq_len)
        if seq.rid in self._rids:
            raise SchedulerError(f"request id {seq.rid} is already queued or running")
        self._rids.add(seq.rid)
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.suspended or self.waiting or self.running)

    # ------------------------------------------------------------------ schedule

    def schedule(self, draft_lens: Mapping[int, int] | None = None) -> Step | None:
        """The next iteration's batch, with every scheduled request resized in the
        manager (side effect), or None when there is nothing to run. Decodes come
        first, then running prefills, then new admissions, within
        `max_num_tokens` tokens and `max_batch_size` requests. In suspend mode the
        suspended requests are resumed first (pages copied back: side effect)."""
        self._resume()
        if not self.has_work():
            return None
        limits, extra = self.limits, self.limits.num_extra_kv_tokens
        budget = limits.max_num_tokens if limits.max_num_tokens is not None else 1 << 62
        self._step_prefills, self._step_decodes = [], []
        self._preempted, self._rejected = [], []
        decodes, prefills = self._step_decodes, self._step_prefills

        decoding = decoding_of(self.running)
        # the running requests the scan below skips (none left to scan when every one decodes: preemptions
        # only remove); a set of the list found, as no request starts or stops decoding meanwhile
        skip = set(decoding) if len(decoding) < len(self.running) else None
        budget = self._schedule_decodes(decoding, draft_lens, budget)
        i = 0
        while skip is not None and i < len(self.running) and budget > 0:  # chunks of prompts already admitted
            seq = self.running[i]
            if seq in skip:
                i += 1
                continue
            h, chunk = seq.num_computed, min(seq.num_pending, budget)
            n = self.chunks.largest(seq.rid, h, chunk)
            if not n and self._resize_or_preempt(seq, h + chunk + extra, h):
                n = chunk  # room was made by preempting later requests
            if n:
                prefills.append((seq, h, n))
                budget -= n
                i += 1  # else `seq` itself left the running list
        budget = self._admit(budget)
        if self._preempted:
            self.admission.preempted(self.running)
        else:
            self.admission.step()

        # A victim preempted after it was scheduled gives its slot back.
        if self._preempted:
            gone = {s.rid for s in self._preempted}
            decodes[:] = [d for d in decodes if d[0].rid not in gone]
            prefills[:] = [p for p in prefills if p[0].rid not in gone]
        return self._pad(decodes, prefills, bool(draft_lens))

    def _schedule_decodes(self, decoding: list[Sequence], draft_lens: Mapping[int, int] | None, budget: int) -> int:
        """Resize every `decoding` request (the running ones that decode, in
        order) for one more token (+ drafts + E): first all at once through the
        manager's batch path, and only when that fails one by one, preempting
        from the back of the running list."""
        extra = self.limits.num_extra_kv_tokens
        if not draft_lens and len(decoding) <= budget:  # a token each, all within the budget (no drafts)
            rows = [(seq, 0) for seq in decoding]
            budget -= len(rows)
        else:
            rows, budget = self._decode_rows(decoding, draft_lens, budget)
        if not rows:
            return budget
        hists = [s.num_computed for s, _ in rows]
        caps = [h + 1 + k + extra for h, (_, k) in zip(hists, rows, strict=True)]
        if self.manager.resize_many([s.rid for s, _ in rows], caps, hists):
            self._step_decodes.extend(rows)
            return budget
        return self._decode_one_by_one(rows, budget)

    def _decode_rows(
        self, decoding: list[Sequence], draft_lens: Mapping[int, int] | None, budget: int
    ) -> tuple[list[tuple[Sequence, int]], int]:
        """The decode rows (request, draft tokens) that fit the token `budget`,
        in order, and the budget they leave: a token each plus its drafts,
        which only take what the budget leaves (fewer, not none)."""
        rows: list[tuple[Sequence, int]] = []
        for seq in decoding:
            k = 0
            if draft_lens:
                room = seq.max_new_tokens - len(seq.output_ids) - 1
                k = max(0, min(draft_lens.get(seq.rid, 0), self.limits.max_draft_len, room, budget - 1))
            if 1 + k > budget:
                continue
            rows.append((seq, k))
            budget -= 1 + k
        return rows, budget

    def _decode_one_by_one(self, rows: list[tuple[Sequence, int]], budget: int) -> int:
        """Resize the decode `rows` (their tokens already taken from `budget`)
        one by one, preempting from the back of the running list (a row
        preempted or left without pages gives its tokens back); the budget
        left."""
        extra = self.limits.num_extra_kv_tokens
        for seq, k in rows:
            if seq.status is not Status.RUNNING:  # preempted for an earlier row
                budget += 1 + k
                continue
            h = seq.num_computed
            if self._resize_or_preempt(seq, h + 1 + k + extra, h):
                self._step_decodes.append((seq, k))
            else:
                budget += 1 + k
        return budget

    def _admit(self, budget: int) -> int:
        """FCFS admission (rule 4 of docs/sched.md). Each head is first asked
        of the manager without registering it (`can_create`), as vLLM checks
        the free blocks before it touches a cached one: a head that must wait
        leaves the cache as it was. `blocked` then says that the head waits
        for pages (None when admission stopped for another reason)."""
        preempted = {s.rid for s in self._preempted}
        extra = self.limits.num_extra_kv_tokens
        self.blocked = None
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_batch_size:
            seq = self.waiting[0]
            if seq.rid in preempted:  # not recomputed in the step that evicted it
                break
            tokens = seq.token_ids
            if self._asked is not None and self._asked[0] is seq:  # asked again: the ids as the manager checked them
                tokens = checked_ids(self._asked[1], tokens)
            check = (
                None
                if self.no_room()
                # (`token_ids` is never written, only appended to: the manager keeps it, not a copy)
                else self.manager.can_create(tokens if self.enable_reuse else None, seq.salt, 1 + extra, frozen=True)
            )
            if check is not None:
                self._asked = (seq, check)
            fits = bool(check)
            if check and self.admission.reserves:
                fits = self.admission.fits(
                    self.manager, self.running, seq, reused=check.hit, extra=extra, taken=check.taken
                )
            if not fits:
                if not self.running:  # alone and still no room: it never fits
                    self.waiting.popleft()
                    self._reject(seq, "needs more pages than the pools hold")
                    continue
                if not self.admission.reserves:  # what a reservation needs changes as requests decode
                    self.blocked = Blocked(seq, check)
                break  # head-of-line: wait until running requests free pages
            tokens = checked_ids(check, tokens)
            reused = self.manager.create(seq.rid, tokens if self.enable_reuse else None, seq.salt)
            n = self.chunks.largest(seq.rid, reused, min(len(tokens) - reused, budget))
            if not n:  # pragma: no cover - `can_create` said that one position fits
                raise SchedulerError(f"request {seq.rid}: admitted by can_create, but no position fits")
            self.waiting.popleft()
            self.commits.admit(seq.rid, len(tokens))
            seq.status, seq.num_computed, seq.num_cached = Status.RUNNING, reused, reused
            self.running.append(seq)
            self._step_prefills.append((seq, reused, n))
            budget -= n
        return budget

    def no_room(self) -> bool:
        """Whether no request can be created now, whatever it finds cached: a
        hit is whole pages, so its first position after it opens a page in
        every group whose pages grow, and a pool of such a group has no page
        free or evictable. A cheap sufficient test, asked before the manager
        digests the head's prompt (`can_create` would answer it short)."""
        free = self.manager.free_pages
        return any(free(g) == 0 for g in self._opening)

    def _resize_or_preempt(self, seq: Sequence, capacity: int, history: int) -> bool:
        """Resize `seq`; while that fails, preempt the most recently admitted
        running request. False when `seq` itself was preempted or rejected."""
        while not self.manager.resize(seq.rid, capacity, history):
            victim = self.running[-1]
            if victim is seq and len(self.running) == 1:
                self._reject(seq, "needs more pages than the pools hold")
                return False
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _resume(self) -> None:
        tiered = self.tiered
        while tiered is not None and self.suspended and len(self.running) < self.limits.max_batch_size:
            seq = self.suspended[0]
            parked = tiered.suspension(seq.rid)
            pages = sum(map(len, parked.slots)) if parked is not None else 0
            if not tiered.resume(seq.rid):
                if not self.running:  # nothing will free pages: recompute it instead of waiting forever
                    self.suspended.popleft()
                    tiered.free(seq.rid)
                    seq.status, seq.num_computed, seq.num_cached = Status.WAITING, 0, 0
                    self.waiting.appendleft(seq)
                    continue
                return
            self.suspended.popleft()
            self.resumed_pages += pages
            seq.status = Status.RUNNING
            self.running.append(seq)

    def _suspend(self, seq: Sequence) -> bool:
        """Park `seq` in a cold tier; False (nothing changed) in recompute mode or
        when no tier has room."""
        if self.tiered is None or not self.tiered.suspend(seq.rid):
            return False
        self.running.remove(seq)
        seq.status = Status.WAITING  # keeps num_computed: its pages come back
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.num_suspensions += 1
        parked = self.tiered.suspension(seq.rid)
        self.suspended_pages += sum(map(len, parked.slots)) if parked is not None else 0
        self.suspended.append(seq)
        self._preempted.append(seq)  # the step drops it, as a recomputed victim
        return True

    def _preempt(self, seq: Sequence) -> None:
        if self._suspend(seq):
            return
        self.commits.commit_filled(seq)
        self.manager.free(seq.rid)
        self.running.remove(seq)
        seq.status, seq.num_computed, seq.num_cached = Status.WAITING, 0, 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        self._preempted.append(seq)

    def _reject(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.RUNNING:
            self.manager.free(seq.rid)
            self.running.remove(seq)
        seq.status, seq.finish_reason = Status.REJECTED, reason
        self._rids.discard(seq.rid)
        self._rejected.append(seq)

    def _pad(
        self, decodes: list[tuple[Sequence, int]], prefills: list[tuple[Sequence, int, int]], drafts: bool
    ) -> Step:
        """Pad a decode-only batch to the smallest captured size ≥ its size (`drafts`: whether any were asked for)."""
        batch = len(decodes)
        draft = max(map(itemgetter(1), decodes), default=0) if drafts else 0  # (in C: a generator resumes once per row)
        padded = pad_rid = None
        if decodes and not prefills:
            padded, pad_rid = self.graphs.pad(batch, draft)
        graph = padded is not None
        return Step(
            prefills=list(prefills),
            decodes=list(decodes),
            preempted=list(self._preempted),
            batch_size=batch,
            padded_batch_size=padded,
            padding_rid=pad_rid,
            graph=graph,
            rejected=list(self._rejected),
            draft_len=draft,
        )

    # ------------------------------------------------------------------ update

    def update(self, step: Step, sampled: Mapping[int, list[int]]) -> list[Sequence]:
        """Apply a step's results: advance each request's history by the tokens
        it computed and verified, append sampled tokens, commit verified full
        pages for reuse, and free finished requests (side effects on the
        manager). `sampled[rid]`: one token for a prefill chunk that ends its
        sequence (ignored for other chunks); 1..k+1 accepted tokens for a decode
        row with k drafts. Returns the requests that finished."""
        finished: list[Sequence] = []
        tpb, max_len = self.manager.spec.tokens_per_block, self.limits.max_seq_len
        for seq, start, n in step.prefills:
            seq.num_computed = start + n
            self.commits.commit_prefilled(seq)
            if seq.num_computed == seq.num_tokens:
                tokens = sampled.get(seq.rid)
                if not tokens:
                    raise SchedulerError(f"request {seq.rid} finished its prefill but no token was sampled")
                check_sampled(seq, tokens[:1])
                if append_tokens(seq, tokens[:1], max_len):
                    finished.append(seq)
        for seq, k in step.decodes:
            tokens = sampled.get(seq.rid)
            if not tokens or len(tokens) > k + 1:
                raise SchedulerError(
                    f"request {seq.rid}: decode with {k} drafts must accept 1..{k + 1} tokens, "
                    f"got {0 if not tokens else len(tokens)}"
                )
            if len(tokens) != 1 or type(t := tokens[0]) is not int or not 0 <= t <= INT64_MAX:
                check_sampled(seq, tokens)  # (one plain id in range: checked above)
            before = seq.num_computed
            seq.num_computed = now = before + len(tokens)
            if append_tokens(seq, tokens, max_len):
                finished.append(seq)  # `finish` commits its pages
            elif now // tpb > before // tpb:
                self.commits.commit_filled(seq)
        self.graphs.release()
        self.finish(finished)
        return finished

    def finish(self, finished: list[Sequence]) -> None:
        """Commit and free the pages of requests that finished (their status
        already says so): they leave the running list and the manager."""
        if finished:
            done = {s.rid for s in finished}
            self.running = [s for s in self.running if s.rid not in done]
            for seq in finished:
                self.commits.commit_filled(seq)
                self.commits.forget(seq.rid)
                self.manager.free(seq.rid)
                self._rids.discard(seq.rid)
