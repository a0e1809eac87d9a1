"""`kvpool sweep GRID.yaml`: every point of a grid (model x GPU x budget x
trace x policy or split) simulated, on Ray when it is installed, and one
JSON / CSV of all points plus a plot."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.cli.common import positive_int, table
from kvpool.cli.files import Content, check_output, grid_file, write_outputs
from kvpool.errors import KvpoolError
from kvpool.sim.serial_or_ray import Bar, ray_available, run_all
from kvpool.sim.sweep import GridError, Point, best_shares, expand_grid, load_grid, rows_paths, rows_texts, run_point

# A grid past this is a typo (each point is a whole simulation); refused before it is expanded.
MAX_POINTS = 10_000


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sweep",
        help="simulate every point of a grid (models x GPUs x budgets x traces x policies)",
        description="Expand GRID (YAML or JSON: each field a value or a list; the points are "
        "their product, see kvpool.sim.sweep) and simulate every point, as Ray tasks "
        "when Ray is installed (pip install 'kvpool[sweep]'), else serially. "
        "Writes OUT.json and OUT.csv with one row per point.",
    )
    p.add_argument("grid", type=grid_file, metavar="GRID.yaml", help="the grid file")
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


def read_grid(path: Path) -> dict[str, Any]:
    """The grid in `path`, checked before it is expanded: UTF-8 text, fields that
    are a value or a flat list of values, and at most `MAX_POINTS` points (their
    count is the product of the list lengths, computed without building them)."""
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise GridError(f"grid {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    try:
        grid = load_grid(path)
    except RecursionError:
        raise GridError(f"grid {path} is nested too deeply; each field is a value or a list of values") from None
    count, policies = 1, 1
    for name, value in grid.items():
        if name == "sweep":
            policies += sweep_points(path, value)
            continue
        values = flat_values(path, name, value)
        if name in ("policy", "policies"):
            policies += len(values) - 1
        else:
            count = min(count * len(values), MAX_POINTS + 1)  # capped: a product of 10**9 is never built
    if count * policies > MAX_POINTS:
        raise GridError(f"grid {path} has more than {MAX_POINTS:,} points; split it into smaller grids")
    return grid


def sweep_points(path: Path, value: Any) -> int:
    """The points of the grid's `sweep` mapping (default 10), checked."""
    points = value.get("points", 10) if isinstance(value, dict) else None
    if not isinstance(points, int) or isinstance(points, bool) or not 2 <= points <= MAX_POINTS:
        raise GridError(f"grid {path}: sweep needs a mapping whose points is an integer in [2, {MAX_POINTS:,}]")
    return points


def flat_values(path: Path, name: str, value: Any) -> list[Any]:
    """A field's values: the value, or its flat list."""
    values = value if isinstance(value, list) else [value]
    nested = [v for v in values if isinstance(v, (list, dict))]
    if nested:
        kind = type(nested[0]).__name__
        raise GridError(f"grid {path}: field {name!r} holds a nested {kind}; give a value or a list of values")
    return values


def named(flag: str, check: Callable[[], Path]) -> Path:
    """`check()`, its KvpoolError prefixed with the flag it is about."""
    try:
        return check()
    except KvpoolError as e:
        raise KvpoolError(f"{flag}: {e}") from None


def out_base(text: str) -> Path:
    """`--out OUT` (or OUT.json / OUT.csv): OUT.json, checked writable; OUT itself may not be a folder."""
    if Path(text).is_dir():
        raise KvpoolError(f"{text} is a folder; give a base name such as {Path(text) / 'sweep'}")
    return check_output(text if Path(text).suffix.lower() in (".json", ".csv") else f"{text}.json")


def check_options(args: argparse.Namespace) -> None:
    """The outputs are writable and the options agree, before any point runs."""
    named("--out", lambda: out_base(args.out))
    if args.plot is not None:
        named("--plot", lambda: check_output(args.plot))
    if args.serial and (args.workers or args.ray_address):
        raise KvpoolError("--serial runs without Ray; drop --workers / --ray-address")


def run(args: argparse.Namespace) -> int:
    check_options(args)
    points = expand_grid(read_grid(args.grid))
    if args.plot:
        from kvpool.sim.plot import check_target

        check_target(args.plot)
    rows, how = run_points(args, points)
    rows = best_shares(rows)
    paths = rows_paths(args.out)
    outputs: list[tuple[str | Path, Content, str]] = [
        (path, text, "--out") for path, text in zip(paths, rows_texts(rows), strict=True)
    ]
    if args.plot:
        outputs.append((args.plot, plot_content(args.plot, rows, points), "--plot"))
    write_outputs(outputs)  # all whole, or none: a full disk leaves the old files as they were
    print(
        table(
            ["model", "gpu", "kv", "trace", "policy", "tok/s", "of best", "preempt / error"], [shown(r) for r in rows]
        )
    )
    print(f"\n{how}")
    print("wrote " + ", ".join(str(p) for p in paths) + (f", {args.plot}" if args.plot else ""))
    return 0


def plot_content(path: str, rows: list[dict[str, Any]], points: list[Point]) -> Content:
    """tok/s against the swept group's share (the group of the first ratio policy),
    as the writer of `path`'s bytes."""
    from kvpool.sim.plot import plot_format
    from kvpool.sim.sweep_plot import plot_sweep

    group = next((p.policy.removeprefix("ratio:").split("=")[0] for p in points if p.policy.startswith("ratio:")), None)
    fmt = plot_format(path)
    return lambda f: plot_sweep(f, rows, group, fmt)


def run_points(args: argparse.Namespace, points: list[Point]) -> tuple[list[dict[str, Any]], str]:
    """Every point simulated: serially, or as Ray tasks (on the machine's cores when
    Ray is installed and neither --workers nor --ray-address says otherwise)."""
    workers = 1 if args.serial else args.workers
    if workers is None and args.ray_address is None and ray_available():
        workers = min(os.cpu_count() or 1, len(points))
    bar = Bar(len(points), "sweep", enabled=not args.quiet)
    try:
        return run_all(run_point, points, workers=workers, ray_address=args.ray_address, bar=bar, describe=Point.label)
    finally:
        bar.close()


def shown(r: dict[str, Any]) -> list[Any]:
    """One point's row of the table: its numbers, or the start of its error."""
    ok = "error" not in r
    best = f"{r['share_of_best']:.1%}" if ok and r["share_of_best"] is not None else "-"
    tok = f"{r['output_tokens_per_s']:,.0f}" if ok else "-"
    return [
        r["model"],
        r["gpu"],
        r["kv_memory"],
        r["trace"],
        r["policy"],
        tok,
        best,
        r["preemptions"] if ok else r["error"][:60],
    ]
