"""`kvpool warmup MODEL ...`: dry-run CUDA-graph warmup against a plan's pools."""

from __future__ import annotations

import argparse
from typing import Any

from kvpool import deploy
from kvpool.cache import KVCacheManager, WarmupReport
from kvpool.cli.common import add_json_arg, checked, int_items, print_json, say_fallback, table
from kvpool.cli.plan_args import add_plan_args, plan_keywords
from kvpool.errors import KvpoolError, LimitsError
from kvpool.plan.report import window_decodes_below_graph


def register(sub: Any) -> None:
    p = sub.add_parser(
        "warmup",
        help="dry-run CUDA-graph warmup: which (batch size, draft length) shapes fit",
        description="Plan the pools (same options as `kvpool plan`), then allocate the warmup "
        "dummies of every CUDA-graph batch size and draft length on an empty cache: "
        "b - 1 minimal decodes plus the longest decode that fits. Lists the shapes "
        "captured and, for a skipped one, the group and pages short; then reserves "
        "one padding dummy per draft length.",
    )
    add_plan_args(p)
    p.add_argument(
        "--draft-lens",
        type=checked(draft_lens),
        default=None,
        metavar="D1,D2,...",
        help="draft lengths to warm up (default: 0 and --draft-len)",
    )
    add_json_arg(p)
    p.set_defaults(func=run)


def draft_lens(text: str) -> tuple[int, ...]:
    """`0,4` -> (0, 4): non-negative draft lengths, sorted, no empty item."""
    try:
        return tuple(sorted(set(int_items(text, low=0))))
    except KvpoolError as e:
        raise LimitsError(f"cannot read draft lengths: {e}") from None


def parse_draft_lens(text: str | None, max_draft_len: int) -> tuple[int, ...]:
    if text is None:
        return tuple(sorted({0, max_draft_len}))
    values = draft_lens(text)
    if max(values) > max_draft_len:
        # the plan reserves nothing for longer drafts, and engines refuse them
        raise LimitsError(
            f"--draft-lens: draft length {max(values)} exceeds --draft-len {max_draft_len}; "
            "raise --draft-len to warm it up"
        )
    return values


def shape_rows(report: WarmupReport, batch_sizes: tuple[int, ...], draft: int) -> list[list[Any]]:
    """One row per run of consecutive batch sizes with the same outcome, at one draft length."""
    skipped = {(s.batch_size, s.draft_len): s for s in report.skipped}
    runs: list[tuple[list[int], str, Any]] = []
    for b in batch_sizes:
        s = skipped.get((b, draft))
        outcome = f"skipped: {s.group} short {s.short_pages} pages" if s else "captured"
        longest = "-" if s else report.lengths[(b, draft)]
        if runs and runs[-1][1:] == (outcome, longest):
            runs[-1][0].append(b)
        else:
            runs.append(([b], outcome, longest))
    return [[sizes_label(sizes), draft, longest, outcome] for sizes, outcome, longest in runs]


def sizes_label(sizes: list[int]) -> str:
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}..{sizes[-1]} ({len(sizes)})"


def padding_text(report: WarmupReport) -> str:
    """Which padding dummy each draft length has, and the pages they reserve."""

    def pad(d: int, rid: int | None) -> str:
        if rid is not None:
            return f"draft {d}: request {rid}"
        return f"draft {d}: {'NOT RESERVED' if d in report.padding_short else 'not needed'}"

    pads = ", ".join(pad(d, r) for d, r in report.padding.items())
    reserved = ", ".join(f"{g} {n}" for g, n in report.reserved_pages.items())
    return f"padding dummies ({pads}) reserve pages: {reserved}"


def render(report: WarmupReport, batch_sizes: tuple[int, ...], drafts: tuple[int, ...]) -> str:
    """The shapes (one row per run of batch sizes with the same outcome), the count
    captured, the padding dummies, and a warning for each shape that falls back."""
    rows = [row for d in drafts for row in shape_rows(report, batch_sizes, d)]
    n_skipped = len(report.skipped)
    lines = [
        table(["batch sizes", "draft", "longest tokens", "shape"], rows),
        f"\n{len(report.captured)} of {len(report.captured) + n_skipped} shapes captured"
        + (f", {n_skipped} would run eager" if n_skipped else ""),
        padding_text(report),
    ]
    lines += [
        f"warning: no pages for the draft-{d} padding dummy (short {short}): padded "
        "batches of that draft length fall back to eager"
        for d, short in report.padding_short.items()
    ]
    lines += [
        f"warning: warmup shape '{name}' does not fit (short {short}): the engine's warmup would fail"
        for name, short in report.unfit.items()
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    plan = deploy.resolve(deploy.PlanRequest.of(args.model, args.gpu, **plan_keywords(args))).plan()
    say_fallback(plan.spec)
    drafts = parse_draft_lens(args.draft_lens, plan.limits.max_draft_len)
    sizes = plan.limits.graph_batch_sizes
    report = KVCacheManager(plan, enable_reuse=False).warmup(sizes, drafts)
    if args.json:
        print_json({"model": plan.spec.name, **report.to_json()})
    else:
        print(
            f"{plan.spec.name}: warmup on {', '.join(f'{g.name} {g.pages:,}' for g in plan.groups)}"
            f" pages (max_seq_len {plan.limits.max_seq_len})"
        )
        print(render(report, sizes, drafts))
        for name, (held, per) in window_decodes_below_graph(plan).items():
            print(
                f"note: group '{name}' holds {held} full-window decodes ({per} pages each) at once: captured "
                f"batches above {held} form only from shorter requests (kvpool fit says it per engine)"
            )
    return 0
