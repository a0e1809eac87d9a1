"""Runs of identical decode steps at once (the simulator's fast path).

Between two events (an arrival, a finish, a page shortage) a decode-only step
repeats unchanged except that every row is one token longer. `advance_decodes`
applies k such steps with one `manager.extend` call (a few, where pages leave
a sliding window); the result equals k rounds of `Scheduler.schedule()` +
`update()`, the cache's reusable pages included. Only public methods of the
scheduler are used (`finish`), so the two modules import one way.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import NamedTuple

from kvpool.cache.checks import INT64_MAX
from kvpool.sched.scheduler import Scheduler
from kvpool.sched.sequence import SchedulerError, Sequence, append_tokens, check_sampled
from kvpool.sched.step import Step
from kvpool.spec import LayerGroup, decode_worst_case_pages, pages_needed


class DecodeRun(NamedTuple):
    """What `advance_decodes` ran: `steps` decode steps, after which the
    requests `finished` (their pages freed, in row order)."""

    steps: int
    finished: list[Sequence]


def decode_run_limit(sched: Scheduler, step: Step) -> int:
    """How many times in a row `step` can run unchanged: the steps until its
    first row finishes (by length), if it is a decode-only step without drafts
    or lazy padding, nothing was preempted or rejected, and nothing waits or
    what waits stays waiting (`waits_through`); else 0."""
    if step.prefills or not step.decodes or step.draft_len:
        return 0
    if sched.graphs.lazy_dummy is not None or step.preempted or step.rejected:
        return 0
    max_len = sched.limits.max_seq_len
    # (a list, not a generator: min() would resume one per row)
    limit = min([min(s.max_new_tokens, max_len - s.prompt_len) - len(s.output_ids) for s, _ in step.decodes])
    return waits_through(sched, step, limit) if sched.waiting else limit


def waits_through(sched: Scheduler, step: Step, limit: int) -> int:
    """How many of `limit` runs of the decode-only `step` leave the head of the
    queue waiting, so that the steps would not have admitted it: all of them
    when the batch is full (no row finishes meanwhile); else, when the head
    waits for pages (`sched.blocked`) and no group releases pages as rows
    grow, the steps whose new pages the manager said it could spare
    (`CreateCheck.spare`): they leave the head's prefix hit as it is and fewer
    pages free, so it still does not fit. Else 1 (the step alone)."""
    if len(sched.running) >= sched.limits.max_batch_size:
        return limit
    blocked, manager = sched.blocked, sched.manager
    if blocked is None or blocked.seq is not sched.waiting[0]:
        return min(limit, 1)
    growing = [g for g in manager.spec.groups if not g.rule.per_request]
    if any(decode_worst_case_pages(g, sched.limits.headroom) is not None for g in growing):
        return min(limit, 1)
    tpb = manager.spec.tokens_per_block
    caps = [manager.capacity(s.rid) for s, _ in step.decodes]
    first = [-(-c // tpb) * tpb + 1 - c for c in caps]  # the extra steps after which each row takes its next page
    per_pool: dict[str, int] = {}
    for g in growing:
        pool = manager.pool_of(g.name)
        per_pool[pool] = per_pool.get(pool, 0) + 1
    steps = limit
    for pool, groups in per_pool.items():  # every row of each group takes a page every tpb steps from `first` on
        takes = sorted(first * groups)  # (a batch's few rows: plain lists beat NumPy's calls here)
        rounds, j = divmod(blocked.spare.get(pool, 0), len(takes))
        steps = min(steps, takes[j] + rounds * tpb)  # the step that would take one page more than spared
    return max(steps, 1)


def release_steps(groups: list[LayerGroup], histories: list[int], last: int) -> list[int]:
    """The steps t in 1..`last` of a run at which some row (history h + t)
    has a page of one of `groups` go stale, in order."""
    out: set[int] = set()
    for g in groups:
        stale = g.rule.stale_pages
        for h in histories:
            t, now = 0, stale(g, h)
            while stale(g, h + last) > now:  # bisect for the next step that drops a page
                lo, hi = t + 1, last
                while lo < hi:
                    mid = (lo + hi) // 2
                    if stale(g, h + mid) > now:
                        hi = mid
                    else:
                        lo = mid + 1
                out.add(lo)
                t, now = lo, stale(g, h + lo)
    return sorted(out)


def shared_fill_limit(sched: Scheduler, step: Step, steps: int, token: int) -> int:
    """How many of `steps` runs of the decode-only `step` (every row sampling
    `token`) one run may take so that each commit whose outcome depends on the
    evictions made before it comes at the run's last step, after all of them,
    as it does with single steps: a page whose digest another page holds (a
    prompt repeated verbatim fills its twin's decode pages, every output
    being `token`), `PageCommits.shared_fill_step`. All of them (nothing hashed)
    when the run cannot evict a cached page: its rows' new pages, at most one
    per row and page of positions, fit the pages nobody caches."""
    if not sched.enable_reuse:
        return steps
    manager, rows = sched.manager, len(step.decodes)
    groups = [g for g in manager.spec.groups if not g.rule.per_request]
    takes: dict[str, int] = {}  # the most pages the run can allocate, per pool
    for g in groups:
        pool = manager.pool_of(g.name)
        takes[pool] = takes.get(pool, 0) + rows * -(-(steps - 1) // g.tokens_per_block)
    if all(takes[manager.pool_of(g.name)] <= manager.unused_pages(g.name) for g in groups):
        return steps
    tpb = manager.spec.tokens_per_block
    for seq, _ in step.decodes:  # a row that fills a page; only those before the cut the rows before it found
        n = seq.num_computed
        if (n + steps) // tpb > n // tpb and (at := sched.commits.shared_fill_step(seq, steps, token)) is not None:
            steps = at
    return steps


def advance_decodes(
    sched: Scheduler,
    step: Step,
    steps: int,
    token: int,
    *,
    limit: int | None = None,
    on_extended: Callable[[], None] | None = None,
) -> DecodeRun | None:
    """Run the decode-only `step` up to `steps` times in a row, every row
    sampling `token` each time: as many as `shared_fill_limit` allows (a run
    ends at the step a verbatim repeat fills a page its twin's digest holds,
    so that the run leaves the cache as single steps do on any traffic).
    One `manager.extend` call covers steps 2..the last (the
    first was resized by `schedule`); with reuse on and a group whose pages
    leave a window, one call per stretch that ends where some row releases
    pages (`extend_run`), so that the cache ends as single steps leave it.
    Only when nothing else can happen meanwhile: `steps <=
    decode_run_limit(step)`, `token` is no row's EOS, and the pools hold every
    intermediate state (`run_fits`). Returns the steps run and the finished
    requests (their pages freed, `commit_run`), or None (nothing changed).
    `limit`: `decode_run_limit(sched, step)` when the caller has just asked
    it (nothing changed since), so that it is not worked out twice.
    `on_extended` is called once the last step's pages are allocated, before
    finished requests free theirs (to measure peak usage)."""
    if steps < 2 or steps > (decode_run_limit(sched, step) if limit is None else limit):
        return None
    if any([token in s.stop_ids for s, _ in step.decodes]):
        return None
    if type(token) is not int or not 0 <= token <= INT64_MAX:  # checked once: the pages take it as it is
        check_sampled(step.decodes[0][0], [token])
    steps = shared_fill_limit(sched, step, steps, token)
    if steps < 2:
        return None
    windows = run_fits(sched, step, steps)
    if windows is None or not extend_run(sched, step, steps, token, windows):
        return None
    if on_extended is not None:
        on_extended()
    finished = commit_run(sched, step, steps, token)
    sched.finish(finished)
    return DecodeRun(steps, finished)


def run_fits(sched: Scheduler, step: Step, steps: int) -> bool | None:
    """Whether the pools hold every intermediate state of `steps` runs of the
    decode-only `step`: None when they may not; else whether some group
    releases pages as the run moves (a window). For groups whose need is not
    monotone in length (sliding, chunked) the free pages must cover every row
    at its worst-case decode pages (`spec.decode_worst_case_pages`); full and
    compressed groups only grow, so the final state is the largest. In a pool
    shared by several groups the free pages must cover those worst cases plus
    the growing groups' growth over the run."""
    manager, rows = sched.manager, len(step.decodes)
    need: dict[str, int] = {}  # pages every intermediate state may take, per pool
    windows = False
    own: list[LayerGroup] = []  # growing groups in their own pools
    for g in manager.spec.groups:
        worst = decode_worst_case_pages(g, sched.limits.headroom)
        pool = manager.pool_of(g.name)
        if g.rule.per_request:  # a state slot never grows
            continue
        if worst is not None:
            need[pool] = need.get(pool, 0) + rows * worst
            windows = True
        elif pool != g.name:  # a growing group in a shared pool: its growth meanwhile counts against the others
            need[pool] = need.get(pool, 0) + rows * -(-(steps - 1) // g.tokens_per_block)
        else:
            own.append(g)
    if windows:  # (else the one `extend` of `extend_run` answers for these pools: the pages the run adds, all or none)
        caps = [manager.capacity(s.rid) for s, _ in step.decodes]
        for g in own:  # exactly the pages the run adds
            need[g.name] = sum(pages_needed(g, cap + steps - 1) - pages_needed(g, cap) for cap in caps)
    for g in manager.spec.groups:
        if manager.free_pages(g.name) < need.get(manager.pool_of(g.name), 0):
            return None
    return windows


def extend_run(sched: Scheduler, step: Step, steps: int, token: int, windows: bool) -> bool:
    """Allocate the pages of steps 2..`steps` of the decode-only `step` (the
    first was resized by `schedule`); False when they do not fit (nothing
    changed). `windows` (from `run_fits`): some group releases pages as the
    run moves. With reuse on, those pages are stored as they leave: the run's
    ids go first (every decode page offered as it fills), and the move stops
    after each step at which some row releases pages, so that rows release
    (and the LRU lists them) in the order single steps would."""
    manager = sched.manager
    rids = [s.rid for s, _ in step.decodes]
    if not (windows and sched.enable_reuse):
        return manager.extend(rids, steps - 1).ok
    stops = release_steps(
        [g for g in manager.spec.groups if decode_worst_case_pages(g, 1) is not None and not g.rule.per_request],
        [s.num_computed for s, _ in step.decodes],
        steps - 1,
    )
    for seq, _ in step.decodes:
        sched.commits.commit_filled(seq, (token,) * (steps - 1))
    done = 0
    for stop in (*stops, steps - 1):
        if stop > done and not manager.extend(rids, stop - done):  # pragma: no cover - checked by run_fits
            raise SchedulerError("a run of decode steps found fewer pages than its check counted")
        done = stop
    return True


def commit_run(sched: Scheduler, step: Step, steps: int, token: int) -> list[Sequence]:
    """Append `steps` tokens `token` to every row of the decode-only `step`
    (its pages allocated) and offer the pages the run filled in the order
    single steps fill them (pages of equal digests in two rows: the first to
    fill is stored, the other not): those of steps 1..steps-1 the row ahead
    first (it fills a shared page first), rows level in row order, finished
    rows too; then the last step's as `update` offers them, the rows that go
    on in row order (the caller then `finish`es the finished ones). A row that
    filled no page is left as `update` leaves it (its next page offers its
    ids). Returns the finished rows, in row order (as `update` frees them)."""
    ended: set[int] = set()
    run = [token] * steps
    tpb = sched.manager.spec.tokens_per_block
    max_len = sched.limits.max_seq_len
    rows = [seq for seq, _ in step.decodes]
    for seq in sorted(rows, key=attrgetter("num_computed"), reverse=True):  # (stable, reverse too)
        before = seq.num_computed
        seq.num_computed += steps - 1
        if append_tokens(seq, run, max_len):
            ended.add(seq.rid)
        if seq.num_computed // tpb > before // tpb:
            sched.commits.commit_filled(seq, moved=True)  # (`extend` raised its history there)
    for seq in rows:
        seq.num_computed += 1
        if seq.num_computed % tpb == 0 and seq.rid not in ended:
            sched.commits.commit_filled(seq)
    return [seq for seq in rows if seq.rid in ended]
