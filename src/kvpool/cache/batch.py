"""Moving a batch of requests at once (`KVCacheCore.resize_many`, `extend`): the capacity
check, storing the pages that are about to go stale (with reuse on), then one vectorised
move of the slot tables, all or nothing (docs/design.md, rule 6)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvpool.cache import reuse
from kvpool.cache.checks import check_capacity
from kvpool.cache.request import Requests
from kvpool.cache.results import Resize
from kvpool.cache.slots import SlotTables


def move(
    t: SlotTables,
    requests: Requests,
    rids: Sequence[int],
    slots: npt.NDArray[np.intp],
    caps: npt.NDArray[np.int64],
    hists: npt.NDArray[np.int64],
    max_capacity: int,
    keeps_stale: bool,
) -> Resize:
    """Move requests `rids` (in `slots`, validated shapes) to `caps`/`hists`.
    Raises `CacheUsageError` for a capacity past `max_capacity` (dummies
    aside) before anything changes. `keeps_stale`: reuse is on and some group
    releases pages that leave a window, so those are stored first."""
    if len(caps) and int(caps.max()) > max_capacity:
        for j in np.flatnonzero(caps > max_capacity).tolist():
            if not requests.get(rids[j]).dummy:
                check_capacity(rids[j], int(caps[j]), max_capacity)
    if keeps_stale:
        going = [
            (requests.get(rids[j]), int(hists[j]))
            for j in np.flatnonzero(hists >= t.stale_next[:, slots].min(axis=0)).tolist()
        ]
        going = [(req, h) for req, h in going if req.tokens is not None and not req.dummy]
        if going:
            dry = t.resize_batch(slots, caps, hists, dry_run=True)
            if not dry:
                return dry
            for req, h in going:
                reuse.store_before_release(t, req, h)
    return t.resize_batch(slots, caps, hists)
