"""What `kvpool simulate` prints besides its plans: the progress bar, the
results table, and the reading of --rate."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from kvpool.cli.common import table
from kvpool.errors import KvpoolError
from kvpool.sim import Progress, SimResult


def parse_rate(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        rate = float(text)
    except ValueError:
        raise KvpoolError(f"cannot read --rate {text!r}; give requests/s, e.g. 8, or inf") from None
    if math.isnan(rate) or rate <= 0:
        raise KvpoolError(f"--rate must be positive or inf, got {text}")
    return rate


class ProgressBar:
    """Progress on stderr: redrawn in place on a terminal; otherwise one line
    every 15 s, only for runs that take that long."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.last = time.monotonic()

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        line = f"simulate {p.policy}: {p.done}/{p.total} requests, {p.sim_time_s:,.1f} s simulated, {p.wall_s:.0f} s"
        if self.tty:
            sys.stderr.write("\r" + line[:100].ljust(100))
            sys.stderr.flush()
        elif time.monotonic() - self.last >= 15:
            self.last = time.monotonic()
            print(line, file=sys.stderr)

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def results_table(runs: list[SimResult], groups: list[str]) -> str:
    def num(x: float | None, scale: float, digits: int) -> str:
        return "-" if x is None else f"{x * scale:,.{digits}f}"

    reuse = any(r.reuse_hit_rate for r in runs)
    rows = []
    for r in runs:
        row: list[Any] = [r.policy]
        # "-": a group the engine's own split holds inside another's (vLLM: a drafter's layers in the target's groups)
        row += [f"{r.pages[g].total:,}" + (" shared" if r.plan.shared else "") if g in r.pages else "-" for g in groups]
        row += [
            f"{r.output_tokens_per_s:,.0f}",
            f"{r.requests_per_s:.2f}",
            num(r.percentile(r.ttft_s, 50), 1, 2),
            num(r.percentile(r.ttft_s, 99), 1, 2),
            num(r.percentile(r.tpot_s, 50), 1e3, 1),
            num(r.percentile(r.tpot_s, 99), 1e3, 1),
            r.preemptions,
            f"{r.graph_step_share:.0%}",
            r.padding_failures,
        ]
        row += [
            f"{r.pages[g].peak_used / max(r.pages[g].total, 1):.0%}/"
            f"{r.pages[g].mean_used / max(r.pages[g].total, 1):.0%}"
            if g in r.pages
            else "-"
            for g in groups
        ]
        row += ([f"{r.reuse_hit_rate:.0%}"] if reuse else []) + [f"{r.finished}/{r.num_requests}"]
        rows.append(row)
    headers = (
        ["policy"]
        + [f"{g} pages" for g in groups]
        + ["tok/s", "req/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms", "preempt", "graphs", "pad fails"]
        + [f"{g} peak/mean" for g in groups]
        + (["reuse hits"] if reuse else [])
        + ["done"]
    )
    return table(headers, rows)


def run_json(r: SimResult) -> dict[str, Any]:
    """One run as `--json` prints it: the result's own fields plus every other
    number the table shows (TPOT p99, padding failures, mean pages used, reuse
    hits, requests done and rejected), so that a script reads what a person does."""
    out = r.to_json()
    out.update(
        tpot_p99_s=r.percentile(r.tpot_s, 99),
        padding_failures=r.padding_failures,
        reuse_hit_rate=r.reuse_hit_rate,
        finished=r.finished,
        num_requests=r.num_requests,
        rejected=r.rejected,
        shared_pool=bool(r.plan.shared),
    )
    for name, u in r.pages.items():
        out["pages"][name].update(mean_used=u.mean_used)
    return out


def rebalance_lines(runs: list[SimResult]) -> list[str]:
    """One line per online rebalanced run: its moves, the pages moved, the
    split after each move, and its throughput against the best static run."""
    best = max((r for r in runs if r.rebalance is None), key=lambda r: r.output_tokens_per_s, default=None)
    out = []
    for r in runs:
        if r.rebalance is None:
            continue
        log = r.rebalance
        moved = " / ".join(f"{n:,} {g}" for g, n in log["pages_moved"].items()) or "none"
        shares = [f"{r.plan.group(log['group']).share:.1%}"] + [f"{m['share_to']:.1%}" for m in log["log"]]
        line = (
            f"{r.policy}: {log['moves']} moves{' (dry run: would move)' if log['dry_run'] else ''}, "
            f"pages moved {moved}; {log['group']} share {' -> '.join(shares)}"
        )
        if best is not None:
            line += (
                f"; {r.output_tokens_per_s:,.0f} tok/s = {r.output_tokens_per_s / best.output_tokens_per_s:.1%} "
                f"of the best static run ({best.policy})"
            )
        out.append(line)
    return out
