"""The plot of a sweep: output tokens/s against the swept group's byte share,
one curve per combination of the grid, its named policies marked on it
(matplotlib, imported only here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from kvpool.errors import KvpoolError


def plot_sweep(
    out: str | Path | BinaryIO, rows: Sequence[Mapping[str, Any]], group: str | None, fmt: str | None = None
) -> None:
    """Write the sweep plot to `out`, a path (the format from its suffix) or a
    binary file (`fmt`, default png) (side effect). Without a swept group, one
    bar per point."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvpoolError("--plot needs matplotlib: pip install 'kvpool[sim]'") from None
    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    combos: dict[str, list[Mapping[str, Any]]] = {}
    for r in ok:
        name = f"{r['model']} {r['gpu']} {r['kv_memory']} {r['trace']}"
        combos.setdefault(name, []).append(r)
    col = f"share_{group}"
    if group and any(col in r for r in ok):
        markers = "s^Dvp*hX"
        for c, (name, rs) in enumerate(combos.items()):
            sweep = sorted(
                (r[col], r["output_tokens_per_s"]) for r in rs if str(r["policy"]).startswith("ratio:") and col in r
            )
            line = ax.plot([x for x, _ in sweep], [y for _, y in sweep], "-o", ms=3, label=name)
            color = line[0].get_color()
            for k, r in enumerate(x for x in rs if not str(x["policy"]).startswith("ratio:")):
                ax.plot(
                    [r[col]],
                    [r["output_tokens_per_s"]],
                    markers[k % len(markers)],
                    ms=8,
                    color=color,
                    label=f"{r['policy']} ({name})" if c == 0 else r["policy"],
                )
        ax.set_xlabel(f"byte share of group '{group}'")
        xs = [r[col] for r in ok if col in r]
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 20:
            ax.set_xscale("log")
        ax.legend(fontsize=7)
    else:
        ax.bar([str(i) for i in range(len(ok))], [r["output_tokens_per_s"] for r in ok], color="0.6")
        ax.set_xlabel("point (see the JSON / CSV)")
    ax.set_ylabel("output tokens / s (simulated)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(out, format=fmt)  # None: a path's suffix, a file's png
    finally:
        plt.close(fig)
