"""The prefill -> decode handoff (`kvpool.fleet.handoff`) per kind, derived
position by position (a page moves when it holds a position the decode's next
token can still read, or, for a page-granular kind, when it is not wholly
before the first such position), its time over the links of the GPU table,
and the link figures' arithmetic. vLLM's own allocation:
tests/test_fleet_handoff_vllm.py."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool import presets
from kvpool.errors import UnknownPresetError
from kvpool.fleet import HandoffError, bytes_per_token, handoff, handoff_link, handoff_seconds
from kvpool.spec import LayerGroup, ModelSpec, load_model_spec


def five_kinds(tpb: int, window: int, chunk: int, ratio: int) -> ModelSpec:
    groups = (
        LayerGroup("full", "full", (0,), tpb, row_bytes=1024),
        LayerGroup("sliding", "sliding", (1,), tpb, row_bytes=512, window=window),
        LayerGroup("chunked", "chunked", (2,), tpb, row_bytes=256, window=chunk),
        LayerGroup("compressed", "compressed", (3,), tpb, row_bytes=2048, ratio=ratio),
        LayerGroup("state", "state", (4,), tpb, state_bytes=777_777),
    )
    return ModelSpec("toy", "toy", groups, tpb, "bf16", 1, 5)


def pages_from(first_needed: int, prompt: int, tpb: int) -> int:
    """Pages of [0, prompt) not wholly before `first_needed`, counted one by one."""
    return sum(1 for p in range(math.ceil(prompt / tpb)) if (p + 1) * tpb > first_needed)


@settings(max_examples=200, deadline=None)
@given(
    tpb_ratio=st.sampled_from([(4, 2), (8, 4), (16, 4), (32, 8), (64, 64)]),
    window=st.integers(1, 300),
    chunk=st.integers(1, 300),
    prompt=st.integers(1, 3000),
)
def test_each_kind_hands_over_what_the_next_token_can_read(
    tpb_ratio: tuple[int, int], window: int, chunk: int, prompt: int
) -> None:
    tpb, ratio = tpb_ratio
    h = handoff(five_kinds(tpb, window, chunk, ratio), prompt)
    whole = math.ceil(prompt / tpb)
    assert h.of("full").slots == whole and h.of("full").bytes == whole * tpb * 1024
    # the token at `prompt` reads positions prompt + 1 - W .. prompt of a window, its own chunk of a chunked layer
    assert h.of("sliding").slots == pages_from(prompt + 1 - window, prompt, tpb)
    assert h.of("chunked").slots == pages_from(prompt // chunk * chunk, prompt, tpb)
    # a compressed page covers tpb positions in tpb / r rows
    assert h.of("compressed").slots == whole and h.of("compressed").bytes == whole * (tpb // ratio) * 2048
    assert (h.of("state").slots, h.of("state").bytes) == (1, 777_777)
    assert h.bytes == sum(g.bytes for g in h.groups)
    assert bytes_per_token(five_kinds(tpb, window, chunk, ratio), prompt) == h.bytes / prompt


def test_a_window_hands_over_the_same_pages_however_long_the_prompt() -> None:
    spec = load_model_spec("gpt-oss-20b", tokens_per_block=16)
    sliding = [handoff(spec, n).of("sliding").slots for n in (1024, 8192, 32768, 131072)]
    assert sliding == [8, 8, 8, 8]  # 128-token window: 127 positions behind plus the page offset
    full = [handoff(spec, n).of("full").slots for n in (1024, 8192)]
    assert full == [64, 512]


def test_handoff_time_is_the_bytes_over_the_link() -> None:
    spec = load_model_spec("llama-3.1-8b-instruct", tokens_per_block=16)
    h = handoff(spec, 8192)
    # 32 layers x 2 (K, V) x 8 heads x 128 x 2 bytes = 128 KiB per token; 8,192 tokens: 1 GiB
    assert h.bytes == 8192 * 32 * 2 * 8 * 128 * 2 == 2**30
    nvlink = handoff_link(presets.load_gpu("h100"))
    assert nvlink.name == "nvlink4"
    assert handoff_seconds(h, nvlink) == pytest.approx(2**30 / 450e9)
    ndr = handoff_link(presets.load_gpu("h100"), "ib-ndr")
    assert handoff_seconds(h, ndr) == pytest.approx(2**30 / 50e9)  # 21.5 ms: 9x NVLink's 2.4 ms


@pytest.mark.parametrize(
    ("gpu", "link"),
    [("a100", "nvlink3"), ("h100", "nvlink4"), ("h200", "nvlink4"), ("h20", "nvlink4"), ("b200", "nvlink5")]
    + [("gb200", "nvlink5"), ("b300", "nvlink5"), ("l40s", "pcie4_x16"), ("l4", "pcie4_x16"), ("mi300x", "pcie5_x16")],
)
def test_every_gpu_reaches_its_neighbours_over_a_sourced_link(gpu: str, link: str) -> None:
    spec = presets.load_gpu(gpu)
    assert spec.scale_up_link == link
    assert handoff_link(spec).source


def test_link_figures_are_their_quoted_rates_per_direction() -> None:
    links = presets.fabric_links()
    # NVLink: bidirectional per GPU / 2; network links: Gb/s / 8
    assert links["nvlink3"].bytes_per_s == 600e9 / 2
    assert links["nvlink4"].bytes_per_s == 900e9 / 2
    assert links["nvlink5"].bytes_per_s == 1.8e12 / 2
    assert (links["ib_hdr"].bytes_per_s, links["ib_ndr"].bytes_per_s, links["ib_xdr"].bytes_per_s) == (
        25e9,
        50e9,
        100e9,
    )
    assert (links["roce_200gbe"].bytes_per_s, links["roce_400gbe"].bytes_per_s) == (25e9, 50e9)
    assert links["pcie5_x16"].bytes_per_s == presets.host_links()["pcie5_x16"]["bytes_per_s"]
    assert all(link.source and link.kind in ("scale-up", "scale-out", "pcie") for link in links.values())
    assert presets.load_link("IB-NDR") is not None and presets.load_link("roce-400gbe").kind == "scale-out"


def test_a_bad_handoff_or_link_is_a_clear_error() -> None:
    spec = load_model_spec("qwen3-8b")
    for bad in (0, -5, 1.5, True):
        with pytest.raises(HandoffError, match="positive prompt length"):
            handoff(spec, bad)  # type: ignore[arg-type]
    with pytest.raises(UnknownPresetError, match="nvlink4"):
        presets.load_link("nvlink-4")
    with pytest.raises(HandoffError, match="no group"):
        handoff(spec, 10).of("sliding")
