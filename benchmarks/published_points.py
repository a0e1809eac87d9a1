"""Replay published serving benchmarks through `kvpool simulate` and compare times.

Each row of tests/data/published_points/points.csv (README.md there names the sources
and columns) is one published measurement: a model on a GPU at a stated parallelism,
requests of ISL input and OSL output tokens, a concurrency and a measured throughput or
latency. This script sets up what `kvpool simulate` sets up for it (the library's
`kvpool.deploy.Simulation`: the budget, `StepTimeModel.build`, the engine's `engine:*` plan
and admission, `kvpool.sim.simulate`), runs N requests that all arrive at t=0 with at most
`concurrency` running (`max_batch_size`), and prints simulated vs measured and the time
ratio simulated / measured (> 1: the simulator is slower than the GPU was).

The only departure from `kvpool simulate`: the weights are the checkpoint's real bytes per
parameter (FP8 = 1, NVFP4 = 0.5625, the library's `weights=`), which `--weights-bytes` cannot say.
A source whose client sent chat requests (`chat_templates.json` beside the points) reported the
dataset's prompt lengths, while the engine prefilled them inside the model's chat template: such a
point's requests carry the template's tokens on top of ISL (`template_tokens`).

    .venv/bin/python benchmarks/published_points.py            # table + median + worst
    .venv/bin/python benchmarks/published_points.py --markdown # the table for docs/sim.md
    .venv/bin/python benchmarks/published_points.py --json     # the rows
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from kvpool.deploy import Simulation
from kvpool.sim import Weights, load_weights
from kvpool.sim.steptime import params_table
from kvpool.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
POINTS = ROOT / "tests" / "data" / "published_points" / "points.csv"
CHAT_TEMPLATES = POINTS.parent / "chat_templates.json"
CONFIGS = ROOT / "tests" / "data" / "configs"

# NVFP4: 4 bits + one FP8 scale per 16; MXFP4 (gpt-oss): None, the checkpoint as kvpool sizes it from the
# config's quantization_config (experts 4 bits + one E8M0 scale per 32, the rest bf16; models/weight_dtype.py)
BYTES_PER_PARAM: dict[str, float | None] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "mxfp4": None}
ENGINE_POLICY = {"trtllm": "engine:trtllm", "nim": "engine:trtllm", "vllm": "engine:vllm"}
METRICS = ("output_tok_s", "batch_latency_ms", "duration_s")
# Parameter counts of models that are configs here, not presets (the table has no row):
# Mixtral 8x7B: "46.7B total parameters but only uses 12.9B parameters per token"
# (Mistral AI, "Mixtral of experts", mistral.ai/news/mixtral-of-experts).
# Qwen3-235B-A22B: "Number of Parameters: 235B in total and 22B activated" (its model card, Qwen/Qwen3-235B-A22B).
CONFIG_PARAMS = {"Mixtral-8x7B-v0.1.json": (46.7e9, 12.9e9), "Qwen3-235B-A22B.json": (235e9, 22e9)}


class PointError(ValueError):
    """A row of the points file that cannot be read or replayed."""


@dataclass(frozen=True)
class Point:
    """One published measurement (the columns of points.csv)."""

    id: str
    model: str
    published_model: str
    gpu: str
    tp: int
    ep: int
    dp: int
    weights: str
    kv_dtype: str
    engine: str
    isl: int
    osl: int
    concurrency: int
    concurrency_source: str
    max_num_tokens: int
    num_requests: int | None
    metric: str
    measured: float
    source: str
    where: str
    notes: str

    @classmethod
    def from_row(cls, row: dict[str, str], line: int) -> Point:
        """The point of one CSV row; PointError names the line and the column."""

        def text(name: str) -> str:
            value = (row.get(name) or "").strip()
            if not value and name != "notes":
                raise PointError(f"line {line}: column {name!r} is empty")
            return value

        def integer(name: str, *, optional: bool = False) -> int | None:
            value = (row.get(name) or "").strip()
            if not value and optional:
                return None
            try:
                n = int(value)
            except ValueError:
                raise PointError(f"line {line}: {name} {value!r} is not an integer") from None
            if n < 1:
                raise PointError(f"line {line}: {name} must be positive, got {n}")
            return n

        def positive(name: str) -> int:
            n = integer(name)
            assert n is not None
            return n

        try:
            measured = float(text("measured"))
        except ValueError:
            raise PointError(f"line {line}: measured {row.get('measured')!r} is not a number") from None
        if not math.isfinite(measured) or measured <= 0:
            raise PointError(f"line {line}: measured must be a positive number, got {measured}")
        p = cls(
            text("id"),
            text("model"),
            text("published_model"),
            text("gpu"),
            positive("tp"),
            positive("ep"),
            positive("dp"),
            text("weights"),
            text("kv_dtype"),
            text("engine"),
            positive("isl"),
            positive("osl"),
            positive("concurrency"),
            text("concurrency_source"),
            positive("max_num_tokens"),
            integer("num_requests", optional=True),
            text("metric"),
            measured,
            text("source"),
            text("where"),
            text("notes"),
        )
        for name, value, allowed in (
            ("weights", p.weights, BYTES_PER_PARAM),
            ("engine", p.engine, ENGINE_POLICY),
            ("metric", p.metric, METRICS),
        ):
            if value not in allowed:
                raise PointError(f"line {line}: {name} {value!r} is not one of {', '.join(allowed)}")
        if p.concurrency % p.dp:
            raise PointError(f"line {line}: concurrency {p.concurrency} does not split over dp {p.dp}")
        if p.metric == "duration_s" and p.num_requests is None:
            raise PointError(f"line {line}: a duration_s point needs num_requests")
        if p.weights == "mxfp4" and p.model.startswith("config:"):
            raise PointError(f"line {line}: mxfp4 weights are sized from a preset's config")
        return p

    @property
    def model_arg(self) -> str:
        """MODEL as `kvpool simulate` takes it: a preset name or a config path."""
        if self.model.startswith("config:"):
            return str(CONFIGS / self.model.removeprefix("config:"))
        return self.model

    @property
    def params(self) -> tuple[float, float]:
        """(total, active) parameters: the preset's parameter table, else CONFIG_PARAMS."""
        if self.model.startswith("config:"):
            name = self.model.removeprefix("config:")
            if name not in CONFIG_PARAMS:
                raise PointError(f"{self.id}: no parameter count for {name} (add it to CONFIG_PARAMS)")
            return CONFIG_PARAMS[name]
        row = params_table().get(self.model.lower())
        if row is None:
            raise PointError(f"{self.id}: {self.model} has no row in the parameter table")
        return float(row["total_params"]), float(row["active_params"])


def load_points(path: Path = POINTS) -> list[Point]:
    """Every point of the CSV file, checked (PointError on a bad row or a repeated id)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    points = [Point.from_row(r, i + 2) for i, r in enumerate(rows)]
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        raise PointError(f"{path}: repeated ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return points


@cache
def chat_templates(path: Path = CHAT_TEMPLATES) -> tuple[frozenset[str], dict[str, int]]:
    """(sources whose client sent chat requests, template tokens by published checkpoint)."""
    body = json.loads(path.read_text())
    tokens = {m: int(t["tokens"]) for t in body["templates"] for m in t["published_models"]}
    return frozenset(body["chat_sources"]), tokens


def template_tokens(p: Point) -> int:
    """Tokens the engine prefilled on top of the point's ISL: its model's chat template
    when the source sent chat requests, else none. PointError for a chat source's model
    whose template is not in the file (its ISL alone would undercount every prompt)."""
    sources, tokens = chat_templates()
    if p.source not in sources:
        return 0
    if p.published_model not in tokens:
        raise PointError(
            f"{p.id}: {p.source} sent chat requests; {CHAT_TEMPLATES.name} has no template for {p.published_model}"
        )
    return tokens[p.published_model]


def requests_per_rank(p: Point, waves: int) -> int:
    """Requests one rank runs: one batch for a latency point; else `waves` full waves
    of the rank's concurrency, no more than the source ran."""
    per_rank = p.concurrency // p.dp
    if p.metric == "batch_latency_ms":
        return per_rank
    if p.metric == "duration_s":  # every request the source sent, at once
        assert p.num_requests is not None  # from_row checked
        return max(1, p.num_requests // p.dp)
    n = per_rank * max(1, waves)
    if p.num_requests is not None:
        n = min(n, max(1, p.num_requests // p.dp))
    return n


def simulation(p: Point, calibration: str | None, waves: int = 2) -> Simulation:
    """What `kvpool simulate` sets up for the point (`kvpool.deploy`), its requests the
    trace: `requests_per_rank(p, waves)` requests of ISL (+ the chat template's tokens,
    `template_tokens`) prompt and OSL answer tokens, all arriving at t=0."""
    n, prompt = requests_per_rank(p, waves), p.isl + template_tokens(p)
    trace = Trace(p.id, np.full(n, prompt, dtype=np.int64), np.full(n, p.osl, dtype=np.int64), arrival_s=np.zeros(n))
    return Simulation.of(
        p.model_arg,
        gpu=p.gpu,
        trace=trace,
        tp=p.tp,
        ep=p.ep,
        dp=p.dp,
        kv_dtype=p.kv_dtype,
        max_batch_size=p.concurrency // p.dp,
        max_num_tokens=p.max_num_tokens,
        max_seq_len=prompt + p.osl,
        policy=ENGINE_POLICY[p.engine],
        # the budget's weights, and one rank's share of them for the steps; MXFP4 checkpoints are
        # sized from their config's quantization_config, as `kvpool simulate` sizes them
        weights=None if BYTES_PER_PARAM[p.weights] is None else point_weights(p, 1.0),
        calibration=calibration,
    )


def point_weights(p: Point, share: float) -> Weights:
    """One rank's weights at the checkpoint's bytes per parameter (`share` of them)."""
    total, active = p.params
    if BYTES_PER_PARAM[p.weights] is None:  # the preset's own parameter table (its checkpoint's bytes)
        w = load_weights(p.model)
        return Weights(total * share, active * share, w.bytes_per_param, w.num_experts, w.experts_per_token, w.source)
    experts = top_k = None
    if p.model.startswith("config:"):
        config = json.loads((CONFIGS / p.model.removeprefix("config:")).read_text())
        experts = config.get("num_local_experts") or config.get("n_routed_experts") or config.get("num_experts")
        top_k = config.get("num_experts_per_tok")
        source = f"{p.model}; parameters: CONFIG_PARAMS"
    else:
        row = params_table()[p.model.lower()]
        experts, top_k, source = row.get("num_experts"), row.get("experts_per_token"), str(row["source"])
    bpp = BYTES_PER_PARAM[p.weights]
    assert bpp is not None
    return Weights(total * share, active * share, bpp, experts, top_k, f"{source}; {p.weights} weights")


def replay(p: Point, *, waves: int = 2, calibration: str | None = None) -> dict[str, Any]:
    """Simulate one point; its row: measured and simulated (metric units and seconds) and
    the time ratio simulated / measured."""
    setup = simulation(p, calibration, waves)
    n, policy = len(setup.trace), setup.policies[0]
    started = time.monotonic()
    result = setup.run().runs[0]
    if result.finished != n:
        raise PointError(f"{p.id}: {n - result.finished} of {n} requests not done ({result.rejected} rejected)")
    simulated_s = result.makespan_s
    if p.metric == "output_tok_s":
        measured_s = n * p.osl / (p.measured / p.dp)
        simulated = n * p.osl / simulated_s * p.dp
    elif p.metric == "duration_s":
        measured_s, simulated = p.measured, simulated_s
    else:
        measured_s = p.measured / 1000
        simulated = simulated_s * 1000
    return {
        "id": p.id,
        "model": p.model,
        "published_model": p.published_model,
        "gpu": p.gpu,
        "tp": p.tp,
        "ep": p.ep,
        "dp": p.dp,
        "weights": p.weights,
        "engine": p.engine,
        "policy": policy,
        "isl": p.isl,
        "template_tokens": template_tokens(p),
        "osl": p.osl,
        "concurrency": p.concurrency,
        "requests_per_rank": n,
        "metric": p.metric,
        "measured": p.measured,
        "simulated": simulated,
        "measured_s": measured_s,
        "simulated_s": simulated_s,
        "ratio": simulated_s / measured_s,
        "preemptions": result.preemptions,
        "calibration": setup.model.calibration,
        "wall_s": time.monotonic() - started,
        "source": p.source,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median time ratio and the worst point (largest |log ratio|)."""
    ratios = [r["ratio"] for r in rows]
    worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
    return {
        "points": len(rows),
        "median_ratio": statistics.median(ratios),
        "worst": {"id": worst["id"], "ratio": worst["ratio"]},
        "within_2x": sum(0.5 <= x <= 2.0 for x in ratios),
    }


def _value(metric: str, x: float) -> str:
    return {"output_tok_s": f"{x:,.0f} tok/s", "duration_s": f"{x:,.1f} s"}.get(metric, f"{x:,.0f} ms")


def table(rows: list[dict[str, Any]], *, markdown: bool) -> str:
    """The rows as a Markdown table or aligned text, then the summary line."""
    head = ["point", "model", "GPU", "TP/EP/DP", "engine", "ISL/OSL", "conc.", "measured", "simulated", "ratio"]
    body = [
        [
            r["id"],
            r["model"].removeprefix("config:").removesuffix(".json"),
            r["gpu"],
            f"{r['tp']}/{r['ep']}/{r['dp']}",
            r["engine"],
            f"{r['isl']}{'+' + str(r['template_tokens']) if r['template_tokens'] else ''}/{r['osl']}",
            str(r["concurrency"]),
            _value(r["metric"], r["measured"]),
            _value(r["metric"], r["simulated"]),
            f"{r['ratio']:.2f}",
        ]
        for r in rows
    ]
    s = summary(rows)
    foot = (
        f"{s['points']} points, calibration {'/'.join(sorted({r['calibration'] for r in rows}))}: "
        f"median time ratio simulated/measured "
        f"{s['median_ratio']:.2f}; worst {s['worst']['id']} ({s['worst']['ratio']:.2f}); "
        f"{s['within_2x']} of {s['points']} within 2x"
    )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines) + "\n\n" + foot
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:{'<' if i < 6 else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*b) for b in body]
    return "\n".join(lines) + "\n" + foot


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--points", type=Path, default=POINTS, help="points CSV (default: the checked-in one)")
    ap.add_argument("--only", help="comma-separated point ids to run")
    ap.add_argument("--waves", type=int, default=2, help="waves of `concurrency` requests per throughput point")
    ap.add_argument("--calibration", help="as simulate --calibration: a profile file or 'roofline'")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/sim.md)")
    out.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = ap.parse_args(argv)
    try:
        points = load_points(args.points)
        if args.only:
            wanted = args.only.split(",")
            unknown = sorted(set(wanted) - {p.id for p in points})
            if unknown:
                raise PointError(f"unknown point ids: {', '.join(unknown)}")
            points = [p for p in points if p.id in wanted]
        if args.waves < 1:
            raise PointError(f"--waves must be positive, got {args.waves}")
        rows = []
        for p in points:
            rows.append(replay(p, waves=args.waves, calibration=args.calibration))
            if not (args.json or args.markdown):
                print(f"  {p.id}: ratio {rows[-1]['ratio']:.2f} ({rows[-1]['wall_s']:.1f} s)", file=sys.stderr)
    except (PointError, OSError) as e:
        print(f"published_points: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))
    else:
        print(table(rows, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
