"""The plan test factories build valid specs."""

from __future__ import annotations

from plan_helpers import hybrid


def test_factories_build_valid_specs() -> None:
    spec = hybrid(window=64, tpb=16)
    assert spec.group_names == ["full", "sliding"]
    assert spec.group("sliding").page_bytes == 16 * 1024
