"""The tier media enum: one name per place a page can live, equal to the strings
the events and JSON carry, and the one spelling a cold tier takes."""

from __future__ import annotations

import json

import pytest

from kvpool.cache import TierSpec
from kvpool.cache.events import CacheUsageError
from kvpool.media import COLD, Medium


def test_a_medium_is_its_name_in_json_and_in_comparisons() -> None:
    assert json.dumps({Medium.CPU: 1, "m": Medium.DISK}) == '{"CPU": 1, "m": "DISK"}'
    assert [str(m) for m in Medium] == ["GPU", "CPU", "DISK"]
    assert {"CPU": 3}[Medium.CPU] == 3 and Medium("DISK") is Medium.DISK
    assert COLD == (Medium.CPU, Medium.DISK)


def test_a_tier_spec_keeps_the_enum_and_refuses_the_gpu_or_a_typo() -> None:
    spec = TierSpec("CPU", 4096)  # type: ignore[arg-type]  # a caller's string, as before the enum
    assert spec.medium is Medium.CPU
    for bad in (Medium.GPU, "cpu", "SSD"):
        with pytest.raises(CacheUsageError, match="tier medium"):
            TierSpec(bad, 4096)  # type: ignore[arg-type]
