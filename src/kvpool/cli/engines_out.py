"""`kvpool plan ... --engine E` and `--emit E`: an engine's own split beside the
plan, and the launch that makes the engine follow the plan."""

from __future__ import annotations

import argparse

from kvpool.cli.common import checked, concurrency_text, table
from kvpool.engines import registry
from kvpool.engines.common import EnginePool, EngineReport
from kvpool.engines.emit import Emitted
from kvpool.plan import REFERENCE_REQUEST, PoolPlan, decode_shape
from kvpool.units import format_bytes


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """--engine, --emit and --model-id (for `kvpool plan`)."""
    g = p.add_argument_group("engines")
    g.add_argument(
        "--engine",
        type=checked(registry.engine_name),
        default=None,
        metavar="ENGINE[@RELEASE]",
        help="also show what this engine would allocate from the same memory by its own rules: "
        + ", ".join(f"{e} (= {e}@{r[0]})" for e, r in registry.RELEASES.items())
        + "; trtllm@v1 (or trtllm-v1): TensorRT-LLM's old C++ manager",
    )
    g.add_argument(
        "--block-size",
        type=int,
        choices=(16, 32, 64, 128, 256),
        default=None,
        help="--engine vllm: vLLM's --block-size (default: the attention backend's 16, raised for state pages)",
    )
    g.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--engine vllm: async scheduling (on by default on GPU) keeps one more batch of "
        "max_num_batched_tokens in flight for sliding and chunked layers",
    )
    g.add_argument(
        "--emit",
        choices=registry.NAMES,
        default=None,
        help="print the launch command (vllm, sglang) or extra-options YAML (trtllm) that "
        "follows the plan, with a note for each part the engine cannot express",
    )
    g.add_argument(
        "--model-id",
        default=None,
        metavar="ID",
        help="model id for --emit (default: the preset's Hugging Face id, else MODEL)",
    )


def _fits(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_report(report: EngineReport, plan: PoolPlan) -> str:
    """An engine's pools, printed lines, concurrency beside the plan's, refusals."""
    lim = plan.limits
    shapes = [
        REFERENCE_REQUEST,
        None if plan.avg_seq_len is None else decode_shape(plan.avg_seq_len, lim),
        decode_shape(lim.max_seq_len, lim),
    ]

    def fits(p: EnginePool) -> str:
        counts = []
        for shape in shapes:
            need = p.need(*shape) if shape is not None else 0
            counts.append("-" if shape is None or not need else str(p.pages // need))
        return "/".join(counts)

    rows = [
        [
            p.name,
            ",".join(p.groups),
            p.page_tokens or "-",
            f"{p.page_bytes:,}",
            f"{p.pages:,}",
            "-" if p.tokens is None else f"{p.tokens:,}",
            format_bytes(p.bytes),
            fits(p),
        ]
        for p in report.pools
    ]
    ours, theirs = plan.max_concurrency(), report.max_concurrency(plan.avg_seq_len)
    lines = [f"{report.engine} ({report.version_modelled}) from the same {format_bytes(report.budget_bytes)}:"]
    if rows:
        lines.append(
            table(["pool", "groups", "page tokens", "page bytes", "pages", "tokens", "bytes", "fit ref/S/L"], rows)
        )
    lines += [f"prints: {line}" for line in report.lines]
    both = {k: f"{_fits(theirs[k])} / {_fits(ours[k])}" for k in ours}
    lines.append(
        f"requests that fit at once (engine / kvpool): {concurrency_text(both, lim.max_seq_len, plan.avg_seq_len)}"
    )
    lines += [f"refuses: {r}" for r in report.refusals]
    lines += [f"degrades: {d}" for d in report.degradations]
    return "\n".join(lines)


def render(report: EngineReport | None, emitted: Emitted | None, plan: PoolPlan) -> str:
    parts = []
    if report is not None:
        parts.append(render_report(report, plan))
    if emitted is not None:
        parts.append(f"{emitted.engine} launch that follows the plan:\n{emitted.text()}")
    return "\n\n".join(parts)
