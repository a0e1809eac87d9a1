"""Sweeps over (model x GPU x budget x trace x policy or split): a grid file
expanded into points, each point one simulation, the table of all points.

A grid (YAML or JSON) maps point fields to a value or a list of values; the
points are the product of the lists. Fields (defaults in `Point`): `model`,
`gpu`, `trace` and `kv_memory` are required; `policy` (or `policies`) names
the sizing policies (not `online`, whose split changes within a run); an
optional `sweep: {group: sliding, points: 10, range: [0.05, 0.95]}` adds that
many `ratio:GROUP=SHARE` points to every combination
(`kvpool.sim.policies.sweep_shares`). Example:

    model: [gemma-3-27b, gpt-oss-20b]
    gpu: h100
    kv_memory: [16GiB, 20GiB]
    trace: azure-code
    max_requests: 2000
    policy: [reference, workload, occupancy]
    sweep: {group: sliding, points: 8}

Each point runs `run_point` (a module-level, picklable function of a frozen
`Point`), which returns one flat row: the point's fields, the policy's byte
share per group and the run's metrics, or `error` for a plan that does not
fit. Rows carry no wall-clock time, so a Ray run and a serial run give equal
rows.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool import jsonsafe
from kvpool.errors import KvpoolError

ROW_METRICS = (
    "output_tokens_per_s",
    "requests_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "preemptions",
    "graph_step_share",
)


class GridError(KvpoolError, ValueError):
    """A grid file that cannot be read or names an unknown field."""


@dataclass(frozen=True)
class Point:
    """One simulation: a model on a GPU with a KV budget, a trace, a policy."""

    model: str
    gpu: str
    trace: str
    kv_memory: str
    policy: str = "reference"
    kv_dtype: str = "auto"
    max_batch_size: int = 256
    max_seq_len: int = 8192
    max_num_tokens: int | None = 8192
    avg_seq_len: int | None = None
    rate: str = "inf"
    max_requests: int | None = None
    seed: int = 0
    padding: bool = True

    def label(self) -> str:
        return f"{self.model}/{self.gpu}/{self.kv_memory}/{self.trace}/{self.policy}"


FIELDS = tuple(f.name for f in dataclasses.fields(Point))


def load_grid(path: str | Path) -> dict[str, Any]:
    """Read a grid file: YAML (needs pyyaml) or JSON by extension."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise GridError(f"cannot read grid {p}: {e.strerror}") from None
    data = _json_grid(p, text) if p.suffix.lower() == ".json" else _yaml_grid(p, text)
    if not isinstance(data, dict):
        raise GridError(f"grid {p}: expected a mapping of fields to values or lists")
    for name, value in data.items():  # what YAML reads that JSON would refuse (jsonsafe): huge or infinite numbers
        if any(not _plausible(v) for v in (value if isinstance(value, list) else [value])):
            raise GridError(f"grid {p}: field {name!r} holds a number no grid value can be")
    return data


def _plausible(v: Any) -> bool:
    """Not an infinite float, nor an integer past 96 bits."""
    return not (isinstance(v, float) and not math.isfinite(v) or isinstance(v, int) and v.bit_length() > 96)


def _json_grid(p: Path, text: str) -> Any:
    try:
        return jsonsafe.loads(text)
    except jsonsafe.JSONValueError as e:
        raise GridError(f"grid {p}: {e}") from None


def _yaml_grid(p: Path, text: str) -> Any:
    try:
        import yaml  # type: ignore[import-untyped,import-not-found]
    except ImportError:
        raise GridError("a YAML grid needs pyyaml: pip install 'kvpool[sweep]' (or write the grid as .json)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise GridError(f"grid {p}: {e}") from None
    except ValueError:  # an integer past Python's int-string limit
        raise GridError(f"grid {p}: holds an integer of thousands of digits") from None


def expand_grid(grid: Mapping[str, Any]) -> list[Point]:
    """The points of `grid` (module docstring), in the grid's field order."""
    grid = dict(grid)
    if "policies" in grid:
        grid["policy"] = grid.pop("policies")
    sweep = grid.pop("sweep", None)
    check_fields(grid)
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in grid.items()}
    if any(not v for v in axes.values()):
        raise GridError("a grid field has an empty list")
    policies = [str(p) for p in axes.pop("policy", ["reference"])] + swept_policies(sweep)
    if "online" in policies:  # its served split changes between segments: no one plan for a row
        raise GridError("a grid point runs one split: drop policy online (run it with kvpool simulate --policy online)")
    return grid_points(axes, policies)


def check_fields(grid: Mapping[str, Any]) -> None:
    """Raise GridError on a field `Point` does not have, or a required one missing."""
    unknown = sorted(set(grid) - set(FIELDS))
    if unknown:
        raise GridError(f"unknown grid fields {', '.join(unknown)}; known: {', '.join(FIELDS)}, sweep")
    missing = [k for k in ("model", "gpu", "trace", "kv_memory") if k not in grid]
    if missing:
        raise GridError(f"the grid needs {', '.join(missing)}")


def swept_policies(sweep: Any) -> list[str]:
    """The ratio policies of the grid's `sweep` (none without one)."""
    from kvpool.sim.policies import ratio_policy, sweep_shares

    if sweep is None:
        return []
    if not isinstance(sweep, dict) or "group" not in sweep:
        raise GridError("sweep needs a mapping with group (and points, range)")
    low, high = sweep.get("range", [0.05, 0.95])
    shares = sweep_shares(int(sweep.get("points", 10)), float(low), float(high))
    return [ratio_policy(str(sweep["group"]), s) for s in shares]


def grid_points(axes: Mapping[str, list[Any]], policies: list[str]) -> list[Point]:
    """Every combination of the `axes`' values, each under every policy."""
    names = list(axes)
    points = []
    for values in itertools.product(*axes.values()):
        for policy in policies:
            fields: dict[str, Any] = {
                k: (str(v) if k in ("kv_memory", "rate") and v is not None else v)
                for k, v in zip(names, values, strict=True)
            }
            try:
                points.append(Point(**fields, policy=policy))
            except TypeError as e:  # pragma: no cover - names were checked above
                raise GridError(str(e)) from None
    return points


def run_point(point: Point) -> dict[str, Any]:
    """Simulate one point; a flat row (module docstring). KvpoolErrors (an
    infeasible plan, a bad name) become the row's `error`."""
    from kvpool.plan import ServingLimits
    from kvpool.presets import load_gpu
    from kvpool.presets.traces import load_trace
    from kvpool.sim import StepTimeModel, load_weights, simulate
    from kvpool.sim.policies import plan_for
    from kvpool.spec import load_model_spec
    from kvpool.units import parse_size

    row: dict[str, Any] = dataclasses.asdict(point)
    try:
        spec = load_model_spec(point.model, kv_dtype=point.kv_dtype, max_seq_len=point.max_seq_len)
        limits = ServingLimits(
            max_batch_size=point.max_batch_size,
            max_seq_len=point.max_seq_len,
            max_num_tokens=point.max_num_tokens,
            avg_seq_len=point.avg_seq_len,
        )
        rate = None if point.rate in ("", "none", "trace") else float(point.rate)
        trace = load_trace(point.trace, max_requests=point.max_requests).with_rate(rate, point.seed)
        model = StepTimeModel.build(spec, load_gpu(point.gpu), load_weights(point.model))
        pp = plan_for(
            spec,
            limits,
            point.policy,
            kv_memory_bytes=parse_size(point.kv_memory),
            trace=trace,
            model=model,
            padding=point.padding,
        )
        if point.policy == "rebalance":  # online: the plan is only where it starts
            from kvpool.sim.rebalance_sim import simulate_rebalanced

            result, _ = simulate_rebalanced(pp.plan, trace, model, padding=point.padding)
        else:
            result = simulate(pp.plan, trace, model, policy=point.policy, padding=point.padding)
    except (KvpoolError, ValueError) as e:
        return {**row, "error": str(e)}
    data = result.to_json()
    row.update({k: data[k] for k in ROW_METRICS})
    for name, usage in result.pages.items():  # the model's groups (engine:vllm regroups them)
        row[f"share_{name}"] = pp.plan.share_of(name)
        row[f"pages_{name}"] = usage.total
        row[f"peak_{name}"] = usage.peak_used
    row["finished"], row["rejected"] = result.finished, result.rejected
    row["notes"] = " | ".join(pp.notes)
    return row


def best_shares(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each row's throughput as a share of the best `ratio:` row of its
    combination (same fields but the policy); rows without a swept best get None."""

    def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(r[f] for f in FIELDS if f != "policy")

    best: dict[tuple[Any, ...], float] = {}
    for r in rows:
        if str(r["policy"]).startswith("ratio:") and "error" not in r:
            best[key(r)] = max(best.get(key(r), 0.0), float(r["output_tokens_per_s"]))
    out = []
    for r in rows:
        b = best.get(key(r))
        share = float(r["output_tokens_per_s"]) / b if b and "error" not in r else None
        out.append({**r, "share_of_best": share})
    return out


def write_rows(rows: Sequence[Mapping[str, Any]], out: str | Path) -> list[Path]:
    """`OUT.json` (`{"points": rows}`) and `OUT.csv` (one column per key seen);
    `out` may name either, or neither suffix. Returns the paths written."""
    paths = rows_paths(out)
    for path, text in zip(paths, rows_texts(rows), strict=True):
        path.write_text(text)
    return paths


def rows_paths(out: str | Path) -> list[Path]:
    """`OUT.json` and `OUT.csv` for `out` (which may name either, or neither suffix)."""
    base = Path(out)
    if base.suffix.lower() in (".json", ".csv"):
        base = base.with_suffix("")
    return [base.with_suffix(".json"), base.with_suffix(".csv")]


def rows_texts(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The JSON (`{"points": rows}`, non-finite numbers as null) and the CSV (one
    column per key seen) of `rows`."""
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]
    columns: list[str] = []
    for r in clean:
        columns += [k for k in r if k not in columns]
    table = io.StringIO(newline="")
    w = csv.DictWriter(table, fieldnames=columns)
    w.writeheader()
    w.writerows(clean)
    return json.dumps({"points": clean}, indent=1) + "\n", table.getvalue()
