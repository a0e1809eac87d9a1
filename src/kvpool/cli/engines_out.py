"""`kvpool plan ... --engine E` and `--emit E`: an engine's own split beside the
plan, and the launch that makes the engine follow the plan."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from kvpool.cli.common import checked, concurrency_text, table
from kvpool.cli.fit_engines import with_budget_flag
from kvpool.engines import registry
from kvpool.engines.common import EnginePool, EngineReport
from kvpool.engines.emit import Emitted
from kvpool.engines.hf_ids import model_id_for
from kvpool.errors import KvpoolError
from kvpool.models.weights import Parallel
from kvpool.plan import REFERENCE_REQUEST, PoolPlan, decode_shape
from kvpool.plan.memory import MemoryBudget
from kvpool.plan.tiers import TierPlan
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


def engine_options(args: argparse.Namespace) -> registry.EngineOptions:
    return registry.EngineOptions(getattr(args, "block_size", None), getattr(args, "async_scheduling", True))


def check_dependent(args: argparse.Namespace) -> None:
    """Refuse the engine flags that mean nothing without the one they qualify
    (an engine's own option without --engine naming that engine, a launch's model
    id without --emit) rather than ignore them."""
    options = engine_options(args)
    if args.engine is not None:
        registry.check_options(registry.entry(args.engine), options)
    elif options != registry.EngineOptions():
        flag = "--block-size" if options.block_size is not None else "--no-async-scheduling"
        owners = [e.name for e in registry.ENTRIES.values() if e.options]
        raise KvpoolError(f"{flag} is an engine's option: it needs --engine {'|'.join(owners)}")
    if args.emit is None and args.model_id is not None:
        raise KvpoolError("--model-id names the model in the --emit launch: it needs --emit")


def engine_outputs(
    args: argparse.Namespace, plan: PoolPlan, memory: MemoryBudget | None = None, tiers: Sequence[TierPlan] = ()
) -> tuple[EngineReport | None, Emitted | None]:
    """The --engine report and the --emit launch the options ask for (`memory`: the
    whole-GPU breakdown, when known, states SGLang's budget as --mem-fraction-static;
    `tiers`: the cold tiers per rank, stated as the engine's offload flags)."""
    check_dependent(args)
    report = registry.engine_report(args.engine, plan, engine_options(args)) if args.engine else None
    emitted = None
    if args.emit:
        parallel = Parallel(*(getattr(args, k, 1) for k in ("tp", "pp", "ep", "dp")))
        source = plan.spec.source
        hub_id = source.repo_id if source is not None and source.kind == "hub" else None
        model_id = launch_model_id(plan, args.model, args.model_id)
        emitted = with_budget_flag(registry.launch(args.emit, plan, model_id, tiers, parallel), memory)
        if hub_id and source is not None and source.revision != "main":
            # an engine takes the revision as its own option, never as id@revision
            note = f"planned from {hub_id} at revision {source.revision}: give the engine that revision too"
            emitted = dataclasses.replace(emitted, notes=(*emitted.notes, note))
    return report, emitted


def launch_model_id(plan: PoolPlan, model: str, given: str | None) -> str:
    """The model id a launch line names: --model-id, else the hub id the plan was
    read from, else the preset's Hugging Face id, else MODEL."""
    source = plan.spec.source
    hub_id = source.repo_id if source is not None and source.kind == "hub" else None
    return given or hub_id or model_id_for(model)


def render(report: EngineReport | None, emitted: Emitted | None, plan: PoolPlan) -> str:
    parts = []
    if report is not None:
        parts.append(render_report(report, plan))
    if emitted is not None:
        parts.append(f"{emitted.engine} launch that follows the plan:\n{emitted.text()}")
    return "\n\n".join(parts)


def to_json(report: EngineReport | None, emitted: Emitted | None, plan: PoolPlan) -> dict[str, Any]:
    """--emit: the emitted object (its "engine_default" the --engine report, if
    asked); --engine alone: the plan with the report under "engine"."""
    if emitted is not None:
        out = emitted.to_json()
        if report is not None:
            out["engine_default"] = report.to_json(plan.avg_seq_len)
        return out
    out = plan.to_json()
    if report is not None:
        out["engine"] = report.to_json(plan.avg_seq_len)
    return out
