"""Dummy requests on the manager: the batches of dummies of CUDA-graph capture
and warmup (registered all or nothing, under negative ids) and the persistent
padding dummies, one per draft length (`PaddingDummies`).

What a dummy's shape is and whether a batch of them fits is page arithmetic,
`plan.capture`'s, shared with a plan's bare page counts; this module registers
the dummies that fit on the real manager.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from kvpool.cache.checks import as_list, check_dummy_args
from kvpool.cache.moves import move
from kvpool.cache.results import Dummies
from kvpool.plan import capture
from kvpool.plan.capture import WarmupReport
from kvpool.spec.kinds import NEVER

if TYPE_CHECKING:
    from kvpool.cache.manager import KVCacheManager


def add_dummies(mgr: KVCacheManager, batch_size: int, token_num: int, draft_len: int, is_gen: bool) -> Dummies:
    """`KVCacheManager.add_dummy_requests`: `batch_size` dummies of `token_num`
    tokens, all or nothing (a refusal gives the rows and the dummy ids back)."""
    check_dummy_args(batch_size, token_num, draft_len)
    cap, hist = capture.dummy_shape(token_num, draft_len, mgr.limits.num_extra_kv_tokens, is_gen)
    short = capture.shortfall(mgr, [(cap, hist)], copies=batch_size)
    if short:  # answered by the page arithmetic, before any request exists: O(groups) for any batch_size
        return Dummies(short=short)
    registry = mgr.requests
    next_dummy, free_ids = registry.next_dummy, list(registry.free_dummy_ids)
    new_dummy = partial(mgr.tables.new_request, dummy=True, limit=NEVER)  # capacity 0, a fresh negative id
    reqs = [registry.register(registry.dummy_id(), new_dummy) for _ in range(batch_size)]
    done = move(mgr, [(r, cap, hist) for r in reqs])
    if done:
        return Dummies(tuple(r.rid for r in reqs))
    for r in reversed(reqs):  # rows go back in the order they came
        mgr.free(r.rid)
    registry.next_dummy, registry.free_dummy_ids = next_dummy, free_ids
    return Dummies(short=done.short)


def warmup(mgr: KVCacheManager, batch_sizes: Iterable[int] | None, draft_lens: Iterable[int]) -> WarmupReport:
    """`KVCacheManager.warmup`: every shape's arguments checked before the dry
    run (`plan.capture.warmup`) starts."""
    sizes = tuple(mgr.limits.graph_batch_sizes if batch_sizes is None else as_list(batch_sizes, "batch_sizes"))
    drafts = tuple(as_list(draft_lens, "draft_lens"))
    for b in sizes:
        for d in drafts:
            check_dummy_args(b, 1, d)
    return capture.warmup(mgr, sizes, drafts)


class PaddingDummies:
    """Draft length -> id of its persistent padding dummy: a minimal generation
    dummy kept allocated so that padded decode batches always have pages."""

    def __init__(self) -> None:
        self.by_draft: dict[int, int] = {}

    def get(self, draft_len: int) -> int | None:
        """The padding dummy of `draft_len`, or None."""
        return self.by_draft.get(draft_len)

    def reserve(self, mgr: KVCacheManager, draft_len: int) -> int | None:
        """The padding dummy of `draft_len`, added now if needed; None when the
        pages are not there."""
        if draft_len in self.by_draft:
            return self.by_draft[draft_len]
        dummy = mgr.add_dummy_requests(1, 1, draft_len)
        if not dummy:
            return None
        self.by_draft[draft_len] = dummy.ids[0]
        return dummy.ids[0]

    def forget(self, rid: int) -> None:
        """Dummy `rid` is freed: it pads no batch any more."""
        for d, pad in list(self.by_draft.items()):
            if pad == rid:
                del self.by_draft[d]

    def ids(self) -> set[int]:
        """The padding dummies' ids."""
        return set(self.by_draft.values())
