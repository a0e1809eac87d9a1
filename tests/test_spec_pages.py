"""The one page arithmetic, on hand-worked cases."""

from __future__ import annotations

import pytest

from kvpool.spec import LayerGroup, pages_needed, stale_pages


def group(kind: str, tpb: int = 32, window: int | None = None, ratio: int | None = None) -> LayerGroup:
    return LayerGroup(
        name=kind,
        kind=kind,
        layers=(0,),
        tokens_per_block=tpb,  # type: ignore[arg-type]
        row_bytes=0 if kind == "state" else 8,
        state_bytes=64 if kind == "state" else 0,
        window=window,
        ratio=ratio,
    )


def test_full_pages_round_up() -> None:
    g = group("full")
    assert [pages_needed(g, c, 0) for c in (0, 1, 32, 33, 2049)] == [0, 1, 1, 2, 65]


def test_reference_request_sliding_1024() -> None:
    # capacity 2049 -> 65 pages; stale = floor((2048 + 1 - 1024)/32) = 32 -> 33 live
    g = group("sliding", window=1024)
    assert stale_pages(g, 2048) == 32
    assert pages_needed(g, 2049, 2048) == 33


def test_sliding_nothing_stale_inside_first_window() -> None:
    g = group("sliding", window=1024)
    assert stale_pages(g, 1022) == 0 and stale_pages(g, 1055) == 1


@pytest.mark.parametrize(("history", "stale"), [(0, 0), (255, 0), (256, 8), (511, 8), (512, 16)])
def test_chunked_stale_pages(history: int, stale: int) -> None:
    # chunk 256 = 8 pages: the in-flight token's chunk starts at floor(h/256)*256
    assert stale_pages(group("chunked", window=256), history) == stale


def test_compressed_and_state() -> None:
    c = group("compressed", tpb=128, ratio=4)
    assert c.rows_per_page == 32 and pages_needed(c, 129, 128) == 2
    s = group("state")
    assert pages_needed(s, 100_000, 99_999) == 1 and pages_needed(s, 0, 0) == 0
