"""`session`: the one wiring of a plan into a running cache and scheduler.

The reference engine and the simulator both start the same way: a manager
over the plan's pools, the CUDA-graph warmup dry run (which captures shapes
and reserves the persistent padding dummies), and a scheduler that pads decode
batches to the captured sizes with those dummies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kvpool.cache import KVCacheManager, TierSpec, WarmupReport
from kvpool.plan import PoolPlan
from kvpool.plan.plan_pages import plan_warmup
from kvpool.sched.admission import Admission
from kvpool.sched.scheduler import Scheduler


class Session(NamedTuple):
    manager: KVCacheManager
    scheduler: Scheduler
    warmup: WarmupReport | None


def session(
    plan: PoolPlan,
    *,
    enable_reuse: bool = True,
    padding: bool = True,
    warmup: bool = True,
    draft_lens: Iterable[int] = (0,),
    tiers: Sequence[TierSpec] = (),
    admission: str = "optimistic",
    events: bool = True,
    hash_lookahead: int = 0,
) -> Session:
    """A fresh manager and scheduler over `plan`.

    `warmup`: run `manager.warmup` for the plan's CUDA-graph batch sizes and
    `draft_lens` (side effect: reserves one padding dummy per draft length);
    without it no shape counts as captured. `padding=False` emulates engines
    that allocate the padding dummy lazily: the reserved dummies are freed and
    the scheduler asks for a fresh one in each padded step. `tiers`: cold
    tiers below the GPU pools (`cache/tiers.py`). `admission`: the scheduler's
    admission rule (`sched/admission.py`). `events=False`: the manager records
    no KV events (nobody reads them: saves their time and memory).
    `hash_lookahead`: the manager's lookahead digests (`KVCacheManager`)."""
    manager = KVCacheManager(plan, enable_reuse=enable_reuse, tiers=tiers, events=events, hash_lookahead=hash_lookahead)
    report = None
    captured: list[tuple[int, int]] = []
    pads: dict[int, int] = {}
    if warmup:
        report = fresh_warmup(manager, plan, draft_lens)
        captured = list(report.captured)
        pads = {d: rid for d, rid in report.padding.items() if rid is not None}
        if not padding:  # the report then says nothing is reserved
            for rid in pads.values():
                manager.free(rid)
            pads = {}
            report = dataclasses.replace(
                report, padding={d: None for d in report.padding}, reserved_pages={g: 0 for g in report.reserved_pages}
            )
    scheduler = Scheduler(
        manager,
        plan.limits,
        padding=padding,
        captured=captured,
        padding_rids=pads,
        enable_reuse=enable_reuse,
        admission=Admission.named(admission, plan.spec.groups),
    )
    return Session(manager, scheduler, report)


def fresh_warmup(manager: KVCacheManager, plan: PoolPlan, draft_lens: Iterable[int]) -> WarmupReport:
    """`manager.warmup` of the fresh manager of `plan`, without allocating its dummies.

    On an empty cache the dry run's answer is the plan's page arithmetic
    (`plan_warmup`; tests/test_plan_capture.py checks that the two agree), and
    what it leaves behind is its padding dummies, reserved here. The thousands
    of dummies the dry run allocates and frees meanwhile change only which page
    ids and table rows later requests get (the free lists' order), never how
    many pages anything takes, and no result names a page id (KV events carry
    hashes): a run is the same either way. Dummy ids agree too: a new dummy
    takes the smallest free id either way."""
    report = plan_warmup(plan, tuple(draft_lens))
    padding = {d: None if rid is None else manager.reserve_padding_dummy(d) for d, rid in report.padding.items()}
    assert [r is None for r in padding.values()] == [r is None for r in report.padding.values()]  # the same pages
    return dataclasses.replace(report, padding=padding)
