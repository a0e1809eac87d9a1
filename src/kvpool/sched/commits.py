"""`PageCommits`: what the manager has been told of each running request's
token ids, and the commits that offer its computed pages for reuse.

A page is offered the step it fills, as vLLM caches a block the step it
completes: a router reading the events, and a request arriving meanwhile,
see it at once. The manager hashes only ids it has been handed, so each
commit first hands over the ids it has not seen (`known` records how many it
has), then moves the request's history, then commits (docs/sched.md).
"""

from __future__ import annotations

from array import array

from kvpool.cache.checks import check_few_tokens
from kvpool.sched.paged_cache import PagedCache
from kvpool.sched.sequence import SchedulerError, Sequence


class PageCommits:
    """The scheduler's commits to `manager` (none when `enable_reuse` is
    off). The commits mutate the manager (ids handed over, a history move,
    pages offered) and `known`, the one record of the ids each running
    request has handed it: the scheduler sets a request's entry when it
    admits it (`admit`) and drops it when the request leaves (`forget`);
    `shared_fill_step` only asks."""

    __slots__ = ("manager", "enable_reuse", "known")

    def __init__(self, manager: PagedCache, enable_reuse: bool) -> None:
        self.manager, self.enable_reuse = manager, enable_reuse
        self.known: dict[int, int] = {}  # tokens of each running request the manager has seen

    def admit(self, rid: int, num_ids: int) -> None:
        """`rid` was created with its first `num_ids` ids (its prompt) handed over."""
        self.known[rid] = num_ids

    def forget(self, rid: int) -> None:
        """`rid` left the manager: nothing of it is known any more."""
        self.known.pop(rid, None)

    def commit_filled(self, seq: Sequence, ahead: tuple[int, ...] = (), *, moved: bool = False) -> None:
        """Offer every computed page of running `seq` for reuse: the ids the
        manager has not seen go first (so that the pages the history move then
        releases from a sliding window are stored, not dropped), then its
        history moves up to `num_computed`, then the pages are committed.
        `ahead`: the ids a run of decode steps will append after the in-flight
        token (`sched.runs`), handed over before the run's one move. `moved`:
        the manager's history is `num_computed` already (a run's move raised
        it), so the ids and the commit go in one call."""
        if not self.enable_reuse or seq.num_computed == 0:
            return
        rid, n, manager = seq.rid, seq.num_computed, self.manager
        known = self.known.get(rid, 0)
        upto = n + (len(ahead) + 1 if ahead else 0)  # the history the caller reaches
        fresh = None
        if upto > known:
            fresh = unseen(seq, known, upto - len(ahead))
            if ahead:
                fresh.extend(check_few_tokens(ahead, "sampled ids", rid=rid))
            self.known[rid] = upto
        if moved:
            manager.commit(rid, n, fresh)
            return
        if fresh is not None:
            manager.commit(rid, 0, fresh)  # ids only: a total of 0 offers no page
        self.advance_history(seq)
        manager.commit(rid, n)

    def commit_prefilled(self, seq: Sequence) -> None:
        """Offer the whole pages of running `seq` that its prefill computed so
        far (its prompt's ids were handed over at admission): its history
        moves up to `num_computed`, then the pages are committed."""
        if self.enable_reuse:
            self.advance_history(seq)
            self.manager.commit(seq.rid, seq.num_computed)

    def shared_fill_step(self, seq: Sequence, steps: int, token: int) -> int | None:
        """The first of `steps` decode steps of running `seq` (each computes
        one position and samples `token`) after which `seq` commits a page
        whose commit depends on the evictions made before it
        (`KVCacheManager.first_shared_fill`: a page another page holds the
        digest of, a verbatim repeat's); None when none does (or reuse is off).
        Hands the manager nothing: it only asks."""
        if not self.enable_reuse:
            return None
        n, tpb = seq.num_computed, self.manager.spec.tokens_per_block
        upto = (n + steps) // tpb * tpb  # where the last page the steps fill ends
        ids = unseen(seq, self.known.get(seq.rid, 0), n + 1)  # the ids the manager has not seen (through n)
        ids += array("q", (token,)) * (upto - n - 1)  # then the steps' up to there
        at = self.manager.first_shared_fill(seq.rid, ids, upto)
        return None if at is None else at - n

    def advance_history(self, seq: Sequence) -> None:
        """Tell the manager the positions `seq` has computed (commit may not run
        ahead of history); keeps the capacity, so no page is allocated."""
        cap = max(self.manager.capacity(seq.rid), seq.num_computed)
        if not self.manager.resize(seq.rid, cap, seq.num_computed):  # pragma: no cover
            raise SchedulerError(f"request {seq.rid}: raising history needed pages")


def unseen(seq: Sequence, known: int, upto: int) -> array[int]:
    """The ids of positions `known`..`upto` of `seq`, a new int64 array (the
    manager takes it as it is). Those past the prompt are outputs, checked
    where they came in (`Scheduler.update`, a run's token): read from the
    output list, not repacked from `token_ids`."""
    p = seq.prompt_len
    if known < p:  # (the manager saw the whole prompt at admission: not met by the scheduler's own requests)
        return seq.token_ids[known:upto]
    ids = seq.output_ids[known - p : upto - p]
    if len(ids) > 8 and ids.count(ids[0]) == len(ids):  # one id over and over (a run's): repeated in C
        return array("q", ids[:1]) * len(ids)  # (`array` packs a list one id at a time)
    return array("q", ids)
