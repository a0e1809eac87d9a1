"""The cache test factories build what the tests expect."""

from __future__ import annotations

import numpy as np

from cache_helpers import full_spec, hybrid_spec, manager


def test_factories_build_the_groups_the_tests_expect() -> None:
    assert full_spec().group_names == ["full"]
    spec = hybrid_spec(tpb=16, window=40)
    assert [(g.name, g.kind, g.window) for g in spec.groups] == [
        ("full", "full", None),
        ("sliding", "sliding", 40),
        ("linear_state", "state", None),
    ]
    m = manager(spec, {"full": 3, "sliding": 2, "linear_state": 1})
    assert [m.total_pages(g) for g in ("full", "sliding", "linear_state")] == [3, 2, 1]
    assert np.array_equal(m.block_table(m.add_dummy_requests(1, 1).ids[0], "full"), [0])
