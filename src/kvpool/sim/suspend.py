"""Preemption by suspension: a preempted request's pages go to a cold tier and
come back, instead of being dropped and recomputed.

TensorRT-LLM's KV cache manager V2 suspends and resumes requests
(`suspend()` / `resume()`, resume refused above `max_util_for_resume`);
vLLM's v0 scheduler had the same choice as its SWAP preemption mode (a
preempted sequence's blocks swapped out to CPU, swapped back in before new
requests are admitted). `SuspendingScheduler` is the shared scheduler with that
mode: a victim is suspended in the manager (`KVCacheManager.suspend`) and
keeps its computed positions; at the start of each step the suspended requests
are resumed, oldest first, before anything new is admitted. A victim no cold
tier has room for is preempted by recompute, as before. The copies cost link
time in the simulator (`sim/transfers.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from kvpool.cache import KVCacheManager
from kvpool.plan.limits import ServingLimits
from kvpool.sched import Scheduler, Sequence, Step
from kvpool.sched.admission import Admission
from kvpool.sched.sequence import Status


class SuspendingScheduler(Scheduler):
    """`Scheduler` whose preemption suspends the victim when a cold tier has
    room for its pages (`suspended`: oldest first), and recomputes it otherwise.
    `num_suspensions`, `suspended_pages` and `resumed_pages` count what
    suspension did."""

    def __init__(
        self,
        manager: KVCacheManager,
        limits: ServingLimits,
        *,
        padding: bool = True,
        captured: list[tuple[int, int]] | None = None,
        padding_rids: Mapping[int, int] | None = None,
        enable_reuse: bool = True,
        admission: Admission | None = None,
    ) -> None:
        super().__init__(
            manager,
            limits,
            padding=padding,
            captured=captured,
            padding_rids=padding_rids,
            enable_reuse=enable_reuse,
            admission=admission,
        )
        self.tiered = manager  # the manager's suspend / resume, beyond the `PagedCache` protocol
        self.suspended: deque[Sequence] = deque()
        self.num_suspensions = 0
        self.suspended_pages = 0
        self.resumed_pages = 0

    def has_work(self) -> bool:
        return bool(self.suspended) or super().has_work()

    def schedule(self, draft_lens: Mapping[int, int] | None = None) -> Step | None:
        """Resume suspended requests first (oldest first, while the batch has
        room and the manager agrees), then the usual step."""
        self._resume()
        return super().schedule(draft_lens)

    def _resume(self) -> None:
        while self.suspended and len(self.running) < self.limits.max_batch_size:
            seq = self.suspended[0]
            parked = self.tiered.suspension(seq.rid)
            pages = sum(map(len, parked.slots)) if parked is not None else 0
            if not self.tiered.resume(seq.rid):
                if not self.running:  # nothing will free pages: recompute it instead of waiting forever
                    self.suspended.popleft()
                    self.tiered.free(seq.rid)
                    self._requeue(seq)
                    continue
                return
            self.suspended.popleft()
            self.resumed_pages += pages
            seq.status = Status.RUNNING
            self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        if not self.tiered.suspend(seq.rid):  # no cold tier has room: recompute
            super()._preempt(seq)
            return
        self.running.remove(seq)
        seq.status = Status.WAITING  # keeps num_computed: its pages come back
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.num_suspensions += 1
        parked = self.tiered.suspension(seq.rid)
        self.suspended_pages += sum(map(len, parked.slots)) if parked is not None else 0
        self.suspended.append(seq)
        self._preempted.append(seq)  # the step drops it, as a recomputed victim

    def _requeue(self, seq: Sequence) -> None:
        """A suspended request that can never come back (pages freed) waits to be recomputed."""
        seq.status, seq.num_computed, seq.num_cached = Status.WAITING, 0, 0
        self.waiting.appendleft(seq)
