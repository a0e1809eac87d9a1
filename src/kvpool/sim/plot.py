"""Plots of simulation results (matplotlib, imported only here and only when a
plot is asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from kvpool.errors import KvpoolError
from kvpool.sim.metrics import SimResult


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvpoolError("--plot needs matplotlib: pip install 'kvpool[sim]'") from None
    return plt


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend; KvpoolError when matplotlib is missing."""
    return _pyplot()


def check_target(path: str | Path) -> None:
    """Raise KvpoolError now, before any run, if `path` cannot be written as a
    plot (matplotlib missing, or a file type it does not write). Whether the file
    itself can be written is the writer's to check (the CLI's `cli/files.py`)."""
    kinds = _pyplot().gcf().canvas.get_supported_filetypes()
    suffix = plot_format(path)
    if suffix not in kinds:
        raise KvpoolError(
            f"--plot {path}: cannot write a .{suffix or '(no suffix)'} file; use one of .{', .'.join(sorted(kinds))}"
        )


def plot_format(path: str | Path) -> str:
    """The image format a plot path asks for: its suffix (`png` for `out.png`)."""
    return Path(path).suffix.lower().lstrip(".")


def _sweep_curve(ax: Any, runs: Sequence[SimResult], group: str, sweep: Sequence[tuple[float, SimResult]]) -> None:
    """tokens/s against `group`'s byte share, the named policies marked on the curve."""
    xs = [share for share, _ in sweep]
    ax.plot(xs, [r.output_tokens_per_s for _, r in sweep], "-o", color="0.45", ms=3.5, label=f"ratio:{group}=share")
    markers = iter("s^Dvp*")
    for r in runs:
        ax.plot([r.plan.share_of(group)], [r.output_tokens_per_s], next(markers, "o"), ms=9, label=r.policy)
    ax.set_xlabel(f"byte share of group '{group}'")
    if max(xs) / min(xs) >= 20:  # a geometric sweep (sim.policies.sweep_shares)
        ax.set_xscale("log")


def _run_bars(ax: Any, runs: Sequence[SimResult]) -> None:
    """One bar per run (tokens/s), with its CUDA-graph step share and preemptions."""
    bars = ax.bar([r.policy for r in runs], [r.output_tokens_per_s for r in runs], color="0.6")
    for bar, r in zip(bars, runs, strict=True):
        ax.annotate(
            f"graphs {r.graph_step_share:.0%}\npreempt {r.preemptions}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.tick_params(axis="x", labelrotation=15)


def plot_runs(
    out: str | Path | BinaryIO,
    runs: Sequence[SimResult],
    *,
    title: str = "",
    sweep_group: str | None = None,
    sweep: Sequence[tuple[float, SimResult]] = (),
    fmt: str | None = None,
) -> None:
    """Write a plot to `out`, a path (its folder made; the format from its suffix)
    or a binary file (`fmt`, default png) (side effect). With a sweep: output
    tokens/s against the swept group's byte share, the named policies marked on
    the curve; else one bar per run (tokens/s) with its CUDA-graph step share."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    if sweep_group and sweep:
        _sweep_curve(ax, runs, sweep_group, sweep)
    else:
        _run_bars(ax, runs)
    ax.set_ylabel("output tokens / s (simulated)")
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.12)
    if title:
        ax.set_title(title, fontsize=10)
    if sweep_group and sweep:
        ax.legend(fontsize=8)
    _save(plt, fig, ax, out, fmt)


def plot_host_sweep(
    out: str | Path | BinaryIO, points: Sequence[tuple[int, SimResult]], *, title: str = "", fmt: str | None = None
) -> None:
    """Write a plot to `out` (a path or a binary file, as `plot_runs`) (side
    effect): the prompt hit rate (left axis) and TTFT p50 / p99 (right axis)
    against one rank's host tier bytes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    xs = [b / 2**30 for b, _ in points]
    ax.plot(xs, [100 * r.prompt_hit_rate for _, r in points], "-o", color="tab:blue", label="prompt hit rate")
    ax.set_xlabel("host tier per rank (GiB)")
    ax.set_ylabel("prompt tokens hit (%)", color="tab:blue")
    ax.set_ylim(bottom=0, top=max(5.0, ax.get_ylim()[1] * 1.1))
    ttft = ax.twinx()
    for q, style in ((50, "-s"), (99, "--^")):
        ys = [r.percentile(r.ttft_s, q) for _, r in points]
        ttft.plot(xs, [float("nan") if y is None else y for y in ys], style, color="tab:red", label=f"TTFT p{q}")
    ttft.set_ylabel("TTFT (s, simulated)", color="tab:red")
    ttft.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = ttft.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="center right")
    if title:
        ax.set_title(title, fontsize=10)
    _save(plt, fig, ax, out, fmt)


def _save(plt: Any, fig: Any, ax: Any, out: str | Path | BinaryIO, fmt: str | None) -> None:
    """Grid, layout, write `out` (a path: making its folder) and close the figure."""
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if isinstance(out, str | Path):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, format=fmt)  # None: a path's suffix, a file's png
    finally:
        plt.close(fig)
