"""`kvpool sweep GRID.yaml`: every point of a grid (model x GPU x budget x
trace x policy or split) simulated, on Ray when it is installed, and one
JSON / CSV of all points plus a plot."""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvpool.cli.common import positive_int, table
from kvpool.errors import KvpoolError
from kvpool.sim.executor import Bar, ray_available, run_all
from kvpool.sim.sweep import Point, best_shares, expand_grid, load_grid, run_point, write_rows


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="simulate every point of a grid (models x GPUs x budgets x traces x policies)",
        description="Expand GRID (YAML or JSON: each field a value or a list; the points are "
        "their product, see kvpool.sim.sweep) and simulate every point, as Ray tasks "
        "when Ray is installed (pip install 'kvpool[sweep]'), else serially. "
        "Writes OUT.json and OUT.csv with one row per point.",
    )
    p.add_argument("grid", metavar="GRID.yaml", help="the grid file")
    p.add_argument(
        "--out", default="sweep", metavar="OUT", help="results base name: OUT.json and OUT.csv (default: sweep)"
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="tok/s against the swept share, policies marked (needs matplotlib)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="local Ray CPUs (default: the machine's cores when Ray is installed; 1 runs serially)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="an existing Ray cluster (auto, or ray://HOST:10001) instead of a local one",
    )
    p.add_argument("--serial", action="store_true", help="run in this process, without Ray")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    points = expand_grid(load_grid(args.grid))
    if args.serial and (args.workers or args.ray_address):
        raise KvpoolError("--serial runs without Ray; drop --workers / --ray-address")
    if args.plot:
        from kvpool.sim.plot import check_target

        check_target(args.plot)
    workers = 1 if args.serial else args.workers
    if workers is None and args.ray_address is None and ray_available():
        workers = min(os.cpu_count() or 1, len(points))
    bar = Bar(len(points), "sweep", enabled=not args.quiet)

    def describe(pt: Point) -> str:
        return pt.label()

    try:
        rows, how = run_all(
            run_point, points, workers=workers, ray_address=args.ray_address, bar=bar, describe=describe
        )
    finally:
        bar.close()
    rows = best_shares(rows)
    paths = write_rows(rows, args.out)
    group = next((p.policy.removeprefix("ratio:").split("=")[0] for p in points if p.policy.startswith("ratio:")), None)
    if args.plot:
        from kvpool.sim.sweep_plot import plot_sweep

        plot_sweep(args.plot, rows, group)
    shown = []
    for r in rows:
        ok = "error" not in r
        shown.append(
            [
                r["model"],
                r["gpu"],
                r["kv_memory"],
                r["trace"],
                r["policy"],
                f"{r['output_tokens_per_s']:,.0f}" if ok else "-",
                f"{r['share_of_best']:.1%}" if ok and r["share_of_best"] is not None else "-",
                r["preemptions"] if ok else r["error"][:60],
            ]
        )
    print(table(["model", "gpu", "kv", "trace", "policy", "tok/s", "of best", "preempt / error"], shown))
    print(f"\n{how}")
    print("wrote " + ", ".join(str(p) for p in paths) + (f", {args.plot}" if args.plot else ""))
    return 0
