"""What `kvpool simulate` prints besides its plans: the progress bar, the
results table, the cold tiers' table, and the reading of --rate."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from kvpool.cli.common import table
from kvpool.errors import KvpoolError
from kvpool.media import Medium
from kvpool.sim import Progress, SimResult
from kvpool.units import format_bytes


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


def _num(x: float | None, scale: float, digits: int) -> str:
    return "-" if x is None else f"{x * scale:,.{digits}f}"


def _pages(r: SimResult, g: str) -> str:
    """A group's pages; "-" for a group the engine's own split holds inside another's
    (vLLM: a drafter's layers in the target's groups)."""
    if g not in r.pages:
        return "-"
    return f"{r.pages[g].total:,}" + (" shared" if r.plan.shared else "")


def _use(r: SimResult, g: str) -> str:
    """A group's peak / mean share of its pages used."""
    if g not in r.pages:
        return "-"
    u = r.pages[g]
    return f"{u.peak_used / max(u.total, 1):.0%}/{u.mean_used / max(u.total, 1):.0%}"


def _row(r: SimResult, groups: list[str], reuse: bool) -> list[Any]:
    times = [
        _num(r.percentile(r.ttft_s, 50), 1, 2),
        _num(r.percentile(r.ttft_s, 99), 1, 2),
        _num(r.percentile(r.tpot_s, 50), 1e3, 1),
        _num(r.percentile(r.tpot_s, 99), 1e3, 1),
    ]
    counts = [r.preemptions, f"{r.graph_step_share:.0%}", r.padding_failures]
    hits = [f"{r.reuse_hit_rate:.0%}"] if reuse else []
    return [
        r.policy,
        *(_pages(r, g) for g in groups),
        f"{r.output_tokens_per_s:,.0f}",
        f"{r.requests_per_s:.2f}",
        *times,
        *counts,
        *(_use(r, g) for g in groups),
        *hits,
        f"{r.finished}/{r.num_requests}",
    ]


def results_table(runs: list[SimResult], groups: list[str]) -> str:
    reuse = any(r.reuse_hit_rate for r in runs)
    headers = (
        ["policy"]
        + [f"{g} pages" for g in groups]
        + ["tok/s", "req/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms", "preempt", "graphs", "pad fails"]
        + [f"{g} peak/mean" for g in groups]
        + (["reuse hits"] if reuse else [])
        + ["done"]
    )
    return table(headers, [_row(r, groups, reuse) for r in runs])


def rebalance_lines(runs: list[SimResult]) -> list[str]:
    """One line per online rebalanced run: its moves, the pages moved, the
    split after each move, and its throughput against the best static run."""
    best = best_static(runs)
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
        out.append(line + against(r, best))
    return out


def best_static(runs: list[SimResult]) -> SimResult | None:
    """The fastest run on one static split, if any."""
    return max((r for r in runs if not r.moved_split), key=lambda r: r.output_tokens_per_s, default=None)


def against(r: SimResult, best: SimResult | None) -> str:
    """`r`'s throughput against the best static run, for the end of its line."""
    if best is None or best.output_tokens_per_s <= 0:
        return ""
    ratio = r.output_tokens_per_s / best.output_tokens_per_s
    return f"; {r.output_tokens_per_s:,.0f} tok/s = {ratio:.1%} of the best static run ({best.policy})"


def online_lines(runs: list[SimResult]) -> list[str]:
    """One line per `online` run: each segment's share and the restarts."""
    best = best_static(runs)
    return [
        f"{r.policy}: {o['group']} share {' / '.join(f'{s:.1%}' for s in o['shares'])} over "
        f"{len(o['shares'])} segments (requests {', '.join(map(str, o['bounds'][1:-1]))} start the later ones), "
        f"{o['restarts']} restart(s)" + against(r, best)
        for r in runs
        if (o := r.online) is not None
    ]


def host_label(size: str | None) -> str:
    return "-" if size is None else size


def sweep_table(rows: list[tuple[str | None, SimResult]]) -> str:
    """Per host size: one rank's host tier, the prompt hit rate, TTFT, throughput
    and what the tiers moved."""
    out = []
    for size, r in rows:
        t = r.tiers or {}
        ttft50, ttft99 = r.percentile(r.ttft_s, 50), r.percentile(r.ttft_s, 99)
        out.append(
            [
                host_label(size),
                format_bytes(t.get("bytes", {}).get(Medium.CPU, 0)),
                f"{r.prompt_hit_rate:.1%}",
                "-" if ttft50 is None else f"{ttft50:,.2f}",
                "-" if ttft99 is None else f"{ttft99:,.2f}",
                f"{r.output_tokens_per_s:,.0f}",
                f"{t.get('pages_onboarded', 0):,}",
                f"{t.get('pages_offloaded', 0):,}",
                f"{r.preemptions:,}",
                f"{t.get('suspensions', 0):,}",
                f"{t.get('transfer_s', 0.0):,.2f}",
            ]
        )
    headers = [
        "host memory",
        "host tier/rank",
        "prompt hits",
        "TTFT p50 s",
        "TTFT p99 s",
        "tok/s",
        "pages onboarded",
        "pages offloaded",
        "preempt",
        "suspended",
        "copy s",
    ]
    return table(headers, out)
