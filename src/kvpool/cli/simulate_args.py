"""The options of `kvpool simulate` beyond the plan's: trace, policies, sweep,
rate and output (`cli/simulate_cmd.py` reads them)."""

from __future__ import annotations

import argparse
from typing import Any

from kvpool import presets
from kvpool.cli.common import checked, int_at_least, positive_float, positive_int
from kvpool.cli.tiers_args import add_tier_args
from kvpool.deploy.sim_tiers import host_sizes
from kvpool.deploy.simulation import DEFAULT_SWEEP_RANGE
from kvpool.sched.admission import ADMISSIONS

# Each sweep point is a whole simulation of the trace: past this a typo, not a study.
MAX_SWEEP_POINTS = 200


def add_simulation_args(p: argparse.ArgumentParser) -> Any:
    """Add the "simulation" option group to `p`; returns the group (for the
    KV-event options that follow)."""
    s = p.add_argument_group("simulation")
    s.add_argument(
        "--trace",
        required=True,
        metavar="NAME|PATH",
        help=f"bundled trace ({', '.join(presets.trace_names())}), a mix (azure-conv:600+mooncake-conv:300) "
        "or a trace file: CSV or JSON lines (docs/traces.md)",
    )
    s.add_argument(
        "--policy",
        default=None,
        metavar="P",
        help=(
            "reference (default), typical, workload, occupancy, tuned, rebalance (moves the split while it runs), "
            "online (re-tunes between 4 segments, restarting on a new split) or ratio:GROUP=SHARE,..."
        ),
    )
    s.add_argument(
        "--dry-run", action="store_true", help="rebalance only reports the moves it would make; the split stays"
    )
    s.add_argument(
        "--compare", default=None, metavar="P1,P2,...", help="run several policies on the same trace, side by side"
    )
    s.add_argument(
        "--sweep-ratio",
        default=None,
        metavar="GROUP",
        help="scan GROUP's byte share (a group name, or a kind one group has) "
        "to find the best split; the policies are placed on the curve",
    )
    s.add_argument(
        "--sweep-points",
        type=int_at_least(1, MAX_SWEEP_POINTS),
        default=10,
        metavar="K",
        help=f"shares in the sweep (default 10, at most {MAX_SWEEP_POINTS}: each is a whole simulation)",
    )
    s.add_argument(
        "--sweep-range",
        default=DEFAULT_SWEEP_RANGE,
        metavar="LOW:HIGH",
        help="shares swept (default 0.05:0.95; evenly spaced, geometric when "
        "HIGH/LOW >= 20, e.g. 0.002:0.2 for a small window)",
    )
    s.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="run the --sweep-ratio points as Ray tasks on N local CPUs (needs kvpool[sweep]; serially without Ray)",
    )
    s.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run the --sweep-ratio points on this Ray cluster (auto, ray://HOST:10001)",
    )
    s.add_argument(
        "--rate",
        default=None,
        metavar="R",
        help="requests/s on average (rescaled trace times, or Poisson when the trace "
        "has none); 'inf' sends all at time 0; default: the trace's own times",
    )
    s.add_argument(
        "--max-requests", type=positive_int, default=None, metavar="N", help="only the first N requests of the trace"
    )
    s.add_argument("--seed", type=int_at_least(0), default=0, help="seed of Poisson arrivals (default 0)")
    s.add_argument(
        "--no-padding-reservation",
        action="store_true",
        help="no persistent CUDA-graph padding dummies: allocate one per padded step "
        "(as engines that allocate it lazily do); it fails when the pool is full",
    )
    s.add_argument(
        "--weights-bytes",
        default=None,
        metavar="SIZE",
        help="model weights size (default: data/model_params.json for bundled models)",
    )
    s.add_argument(
        "--active-params",
        type=positive_float,
        default=None,
        metavar="N",
        help="active parameters per token (MoE), e.g. 3.8e9",
    )
    s.add_argument(
        "--no-reuse",
        action="store_true",
        help="turn prefix reuse off: a preempted request recomputes its prompt from the first token "
        "(default on, as in vLLM, SGLang and TensorRT-LLM; without hash ids each prompt is unique)",
    )
    s.add_argument(
        "--admission",
        choices=ADMISSIONS,
        default=None,
        help="how much of its future a request must find room for to be admitted: optimistic (vLLM, "
        "TensorRT-LLM MAX_UTILIZATION), guaranteed (TensorRT-LLM GUARANTEED_NO_EVICT), sglang "
        "(SGLang's new_token_ratio); default: the engine's for engine:* policies, else optimistic",
    )
    s.add_argument(
        "--calibration",
        default=None,
        metavar="FILE|roofline",
        help="step-time constants: a profile `kvpool calibrate` wrote, or 'roofline' for the "
        "uncalibrated peak-rate model (default: the shipped profile of --gpu, fitted to measured kernels)",
    )
    s.add_argument("--plot", default=None, metavar="OUT.png", help="write a plot (needs matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    return s


def add_tier_sim_args(p: argparse.ArgumentParser) -> None:
    """The cold tiers of `kvpool plan` (`cli/tiers_args.py`: --host-memory,
    --disk, --host-rule, --ranks-per-node; here --host-memory may be a list,
    one run per size) and how the simulator moves pages over them."""
    t = add_tier_args(
        p,
        title="cold tiers per rank, and how pages move to them (docs/tiers.md)",
        host_memory=checked(host_sizes),  # deploy.sim_tiers reads the list
        host_memory_note=". A list (0,64GiB,256GiB) runs once per size and shows what each buys",
    )
    t.add_argument(
        "--preemption",
        choices=("recompute", "suspend"),
        default="recompute",
        help="a preempted request's pages: dropped and recomputed (default), or suspended to the host "
        "tier and brought back (TensorRT-LLM V2's suspend/resume; needs a tier)",
    )
    t.add_argument(
        "--host-bandwidth",
        type=positive_float,
        default=None,
        metavar="GB/s",
        help="host <-> GPU bandwidth per direction (default: the GPU preset's host link, kvpool gpus)",
    )
    t.add_argument(
        "--disk-bandwidth",
        type=positive_float,
        default=None,
        metavar="GB/s",
        help="disk read bandwidth (default 7.88: one NVMe drive on PCIe 4.0 x4)",
    )
    t.add_argument(
        "--transfer-overlap",
        action="store_true",
        help="page copies overlap the forward (vLLM's offloading connector); default: the step waits for them "
        "(TensorRT-LLM)",
    )
