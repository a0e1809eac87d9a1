"""CUDA-graph padding: which captured batch size a decode batch pads to, and
which padding dummy fills the extra rows."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Protocol

from kvpool.cache.results import Dummies


class DummySource(Protocol):
    """Where lazy padding dummies come from (a `PagedCache`)."""

    def add_dummy_requests(
        self, batch_size: int, token_num: int, draft_len: int = 0, is_gen: bool = True
    ) -> Dummies: ...
    def free(self, rid: int) -> None: ...


class GraphPadding:
    """The captured (batch size, draft length) shapes and the padding dummies.

    `reserved=True`: pad with the persistent dummy per draft length in
    `padding_rids` (reserved by `manager.warmup`). `reserved=False`: emulate
    engines that allocate the dummy lazily, asking the manager for a fresh
    one-token generation dummy in each padded step (`release` frees it after
    the step); when the pool is full that fails and the step runs eagerly.
    """

    def __init__(
        self,
        manager: DummySource,
        captured: Iterable[tuple[int, int]],
        padding_rids: Mapping[int, int] | None = None,
        *,
        reserved: bool = True,
    ) -> None:
        self.manager, self.reserved = manager, reserved
        self.sizes: dict[int, list[int]] = {}
        for b, d in sorted(set(captured)):
            self.sizes.setdefault(d, []).append(b)
        self.padding_rids = dict(padding_rids or {})
        self.lazy_dummy: int | None = None

    def size_for(self, batch_size: int, draft_len: int = 0) -> int | None:
        """The smallest captured batch size ≥ `batch_size` for `draft_len`, or
        None when no captured graph is that large."""
        sizes = self.sizes.get(draft_len, [])
        j = bisect.bisect_left(sizes, batch_size)
        return sizes[j] if j < len(sizes) else None

    def pad(self, batch_size: int, draft_len: int) -> tuple[int | None, int | None]:
        """(padded batch size, padding dummy id) for a decode-only batch, or
        (None, None) when it must run eagerly. May allocate a lazy dummy."""
        padded = self.size_for(batch_size, draft_len)
        if padded is None or padded == batch_size:
            return padded, None
        if self.reserved:
            rid = self.padding_rids.get(draft_len)
            return (padded, rid) if rid is not None else (None, None)
        # A minimal generation dummy: token_num 1 (its input token); the drafts
        # are added by the manager once (rule 2), not folded into token_num too.
        dummy = self.manager.add_dummy_requests(1, 1, draft_len=draft_len)
        if not dummy:
            return None, None
        self.lazy_dummy = dummy.ids[0]
        return padded, dummy.ids[0]

    def release(self) -> None:
        """Free this step's lazy dummy, if any."""
        if self.lazy_dummy is not None:
            self.manager.free(self.lazy_dummy)
            self.lazy_dummy = None
