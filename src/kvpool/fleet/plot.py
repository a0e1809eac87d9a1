"""Plots of a fleet's run and of a fleet search (matplotlib, imported only
when a plot is asked for, through `kvpool.sim.plot`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from kvpool.fleet.metrics import FleetResult
from kvpool.sim.plot import pyplot

Out = str | Path | BinaryIO


def save(plt: Any, fig: Any, out: Out, fmt: str | None) -> None:
    """Lay out, write `out` (a path, or a binary file in `fmt`, default png) and close the figure."""
    fig.tight_layout()
    try:
        fig.savefig(out, format=fmt)
    finally:
        plt.close(fig)


def plot_fleet(
    out: Out, result: FleetResult, aggregated: FleetResult | None = None, *, title: str = "", fmt: str | None = None
) -> None:
    """Write a plot to `out` (side effect): left, each replica's requests and
    prompt hit rate; right, the fleet's TTFT, ITL and E2E percentiles (beside
    the aggregated fleet's, for a disaggregated run)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    plot_replicas(left, result)
    plot_latencies(right, [result] if aggregated is None else [result, aggregated])
    fig.suptitle(title)
    save(plt, fig, out, fmt)


def plot_replicas(left: Any, result: FleetResult) -> None:
    """On axes `left`: each replica's requests (bars) and prompt hit rate (line)."""
    names = [f"{s.role[0]}{s.index}" for s in result.replicas]
    x = np.arange(len(names))
    left.bar(x, [s.requests for s in result.replicas], color="#4c78a8")
    left.set_xticks(x, names)
    left.set_ylabel("requests served")
    hits = left.twinx()
    hits.plot(x, [s.result.prompt_hit_rate for s in result.replicas], "o-", color="#f58518")
    hits.set_ylabel("prompt hit rate")
    hits.set_ylim(0, 1)
    left.set_title(f"{result.layout}: per replica")


def plot_latencies(right: Any, fleets: list[FleetResult]) -> None:
    """On axes `right`: the TTFT, ITL and E2E p50 and p99 of each of `fleets`, side by side."""
    labels = [f"{m} p{q}" for m in ("ttft", "itl", "e2e") for q in (50, 99)]
    width = 0.8 / len(fleets)
    for k, f in enumerate(fleets):
        lat = f.latencies
        values = [lat.at(m, q) or 0.0 for m in ("ttft", "itl", "e2e") for q in (50, 99)]
        right.bar(np.arange(len(labels)) + k * width, values, width, label=f.layout)
    right.set_xticks(np.arange(len(labels)) + width * (len(fleets) - 1) / 2, labels)
    right.set_yscale("log")
    right.set_ylabel("seconds")
    right.legend(fontsize=8)
    right.set_title("latency percentiles")


def plot_goodput(
    out: Out, points: Sequence[tuple[int, float, bool]], *, slo: str, title: str = "", fmt: str | None = None
) -> None:
    """Write a plot to `out` (side effect): the best goodput found at each GPU
    count, filled where a layout met the SLO."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    gpus = [g for g, _, _ in points]
    ax.plot(gpus, [v for _, v, _ in points], "-", color="#4c78a8")
    for g, v, met in points:
        ax.plot([g], [v], "o", color="#4c78a8", fillstyle="full" if met else "none", markersize=8)
    ax.set_xlabel("GPUs")
    ax.set_ylabel(f"goodput (requests/s within {slo})")
    ax.set_title(title + " (filled: meets the SLO)")
    ax.set_xticks(gpus)
    ax.grid(alpha=0.3)
    save(plt, fig, out, fmt)
