"""What `kvpool simulate --replicas/--router` and `kvpool fit --slo` print: the
fleet's table (per replica, then the fleet), the verdict of a disaggregated
run, the search's answer; and the fleet options they share."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from kvpool.cli.common import int_at_least, non_negative_float, positive_int, table
from kvpool.fleet.router_names import ROUTER_NAMES

if TYPE_CHECKING:  # `kvpool simulate` of one replica loads no fleet
    from kvpool.deploy.fleet_fit import FleetFit
    from kvpool.deploy.fleets import FleetRun
    from kvpool.fleet.metrics import FleetResult


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """The fleet group of `kvpool simulate` (docs/fleet.md)."""
    f = p.add_argument_group("fleet: replicas behind a router, prefill/decode disaggregation (docs/fleet.md)")
    f.add_argument("--replicas", type=int_at_least(1, 64), default=None, metavar="N", help="N replicas of the engine")
    f.add_argument(
        "--router",
        choices=ROUTER_NAMES,
        default=None,
        help="which replica serves a request (default round-robin): least-load, prefix (SGLang's cache-aware "
        "rule on its own tree), kv (Dynamo's cost on the replicas' KV events), kv:sglang",
    )
    f.add_argument(
        "--event-lag-ms",
        type=non_negative_float,
        default=0.0,
        metavar="L",
        help="the kv router sees each KV event L ms after the replica emitted it (default 0)",
    )
    f.add_argument("--prefill-replicas", type=int_at_least(1, 64), default=None, metavar="P", help="prefill replicas")
    f.add_argument("--decode-replicas", type=int_at_least(1, 64), default=None, metavar="D", help="decode replicas")
    add_link_arg(f)
    add_slo_arg(f, required=False)


def add_link_arg(group: Any) -> None:
    group.add_argument(
        "--link",
        default=None,
        metavar="NAME",
        help="the prefill -> decode link (nvlink4, ib-ndr, roce-400gbe, pcie5-x16, ...; default: the GPU's own)",
    )


def add_slo_arg(group: Any, *, required: bool) -> None:
    group.add_argument(
        "--slo",
        default=None,
        required=required,
        metavar="M_Q=T,...",
        help="latency bounds, e.g. ttft_p99=2s,itl_p99=50ms (metrics ttft, itl, e2e; p50, p90, p95, p99, max)",
    )


# fit's options that only the fleet search reads, and their defaults (given without
# --trace and --slo they would be silently ignored: refused instead)
SEARCH_DEFAULTS = {
    "max_gpus": 8,
    "routers": "kv,round-robin",
    "no_disaggregated": False,
    "link": None,
    "rate": None,
    "max_requests": None,
    "workers": None,
    "ray_address": None,
    "plot": None,
    "calibration": None,
}


def add_search_args(p: argparse.ArgumentParser) -> None:
    """`kvpool fit`'s fleet search: with --trace and --slo."""
    s = p.add_argument_group("the smallest fleet for an SLO (with --trace and --slo; docs/fleet.md)")
    s.add_argument("--trace", default=None, metavar="NAME|PATH", help="the traffic the fleet must serve")
    add_slo_arg(s, required=False)
    s.add_argument("--max-gpus", type=int_at_least(1, 64), default=8, metavar="G", help="try up to G GPUs (default 8)")
    s.add_argument(
        "--routers",
        default="kv,round-robin",
        metavar="R,...",
        help=f"routers to try (default kv,round-robin; of {', '.join(ROUTER_NAMES)})",
    )
    s.add_argument("--no-disaggregated", action="store_true", help="aggregated fleets only (no prefill:decode split)")
    add_link_arg(s)
    s.add_argument("--rate", default=None, metavar="R", help="requests/s (default: the trace's own times)")
    s.add_argument("--max-requests", type=positive_int, default=None, metavar="N", help="the first N requests")
    s.add_argument(
        "--workers", type=positive_int, default=None, metavar="N", help="run candidates as Ray tasks on N local CPUs"
    )
    s.add_argument("--ray-address", default=None, metavar="ADDR", help="run candidates on this Ray cluster")
    s.add_argument("--plot", default=None, metavar="OUT.png", help="goodput against GPUs (needs matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--calibration", default=None, metavar="FILE|roofline", help="step-time constants (as simulate)")


class RequestBar:
    """Requests done of the total, on stderr: redrawn on a terminal, else a line every 15 s."""

    def __init__(self, enabled: bool, label: str = "fleet") -> None:
        self.enabled, self.tty, self.label = enabled, sys.stderr.isatty(), label
        self.t0 = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        line = f"{self.label}: {done}/{total} requests, {time.monotonic() - self.t0:.0f} s"
        if self.tty:
            sys.stderr.write("\r" + line.ljust(60))
            sys.stderr.flush()
        elif time.monotonic() - self.last >= 15:
            self.last = time.monotonic()
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r" + " " * 60 + "\r")


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f}"


def fleet_lines(result: FleetResult) -> list[str]:
    """The per-replica table, then the fleet's line."""
    return [replica_table(result), "", fleet_table(result), *fleet_notes(result)]


def replica_table(result: FleetResult) -> str:
    """Each replica's requests, prompt hits, preemptions and peak pages."""
    rows = []
    for s in result.replicas:
        peak = ", ".join(f"{g} {p}" for g, p in s.transfer_peak_pages.items()) or "-"
        rows.append(
            [
                f"{s.role} {s.index}",
                s.requests,
                f"{s.result.prompt_hit_rate:.3f}",  # on a decode replica: the handed-off prompts it held already
                s.result.preemptions,
                ", ".join(f"{g} {u.peak_used}/{u.total}" for g, u in s.result.pages.items()),
                peak if s.role == "decode" else "-",
            ]
        )
    return table(
        ["replica", "requests", "prompt hits", "preemptions", "peak pages used", "pages in transfer (peak)"], rows
    )


def fleet_table(result: FleetResult) -> str:
    """The fleet's throughput, prompt hits, latency percentiles and imbalance."""
    lat = result.latencies
    return table(
        [
            "fleet",
            "GPUs",
            "req/s",
            "tok/s",
            "prompt hits",
            "TTFT p50/p99 ms",
            "ITL p50/p99 ms",
            "E2E p50/p99 ms",
            "imbalance",
        ],
        [
            [
                result.layout,
                result.gpus,
                f"{result.finished / result.makespan_s:.2f}" if result.makespan_s else "-",
                f"{result.output_tokens_per_s:,.0f}",
                f"{result.prompt_hit_rate:.3f}",
                f"{ms(lat.at('ttft', 50))} / {ms(lat.at('ttft', 99))}",
                f"{ms(lat.at('itl', 50))} / {ms(lat.at('itl', 99))}",
                f"{ms(lat.at('e2e', 50))} / {ms(lat.at('e2e', 99))}",
                " ".join(f"{result.imbalance(r):.2f}" for r in sorted({s.role for s in result.replicas})),
            ]
        ],
    )


def fleet_notes(result: FleetResult) -> list[str]:
    """The requests not routed or rejected, and the SLO's verdict."""
    lines = []
    if result.too_long:
        lines.append(f"{result.too_long} requests not routed: their prompt leaves no room under max_seq_len")
    if result.rejected > result.too_long:
        lines.append(f"{result.rejected - result.too_long} requests rejected: more pages than a replica holds")
    if result.slo is not None:
        verdict = "meets it" if result.meets() else "misses " + "; ".join(result.misses())
        lines.append(
            f"SLO {result.slo}: {result.good()}/{len(result.records)} requests within it, "
            f"goodput {result.goodput():.3g} requests/s; the fleet {verdict}"
        )
    return lines


def render_run(run: FleetRun, header: str) -> str:
    lines = [header, *fleet_lines(run.result)]
    if run.aggregated is not None:
        lines += ["", "beside it, aggregated on as many GPUs:", *fleet_lines(run.aggregated), "", str(run.verdict)]
    return "\n".join(lines + [f"note: {n}" for n in run.notes])


def render_fit(found: FleetFit) -> str:
    rows = [
        [e.layout.label, e.gpus, "yes" if e.meets else "no", f"{e.goodput_rps:.3g}", "; ".join(e.misses) or "-"]
        for e in found.evaluations
    ]
    lines = [table(["candidate", "GPUs", "meets", "goodput req/s", "misses"], rows), ""]
    if found.best is None:
        lines.append(f"nothing tried meets {found.slo}: {found.why}")
    else:
        lines.append(f"smallest fleet for {found.slo}: {found.best.layout.label} on {found.best.gpus} GPUs")
        if found.runner_up is not None:
            lines.append(f"runner-up: {found.runner_up.layout.label} ({found.why})")
    return "\n".join(lines + [f"note: {n}" for n in found.notes])
