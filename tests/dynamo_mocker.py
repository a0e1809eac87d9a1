"""A harness for NVIDIA Dynamo 1.6.1's fleet mocker (`run_mocker_trace_replay`,
the Rust replay simulator in the `ai-dynamo-runtime` wheel): a kvpool trace
exported to Mooncake JSONL, replayed by N mocked vLLM workers behind Dynamo's
KV router or round-robin, or by prefill and decode workers with a KV transfer
between them, each worker given the pages, block size and batch limits of a
kvpool plan. Returns the mocker's summary dict (fields: docs/fleet.md).

It lives with the tests, not in kvpool: it is a referee (as the engines'
runners under tests/engines_truth/ are), it needs the Dynamo side venv
(`make dynamo-venv`) that no kvpool install has, and the fleet's comparison
lane is a test. `run_mocker` skips without the venv, or fails under
KVPOOL_ENGINES_REQUIRED=1 (`dynamo_helpers.dynamo_python`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dynamo_helpers import dynamo_python
from kvpool.plan import PoolPlan
from kvpool.presets.traces import write_mooncake_jsonl
from kvpool.trace import MOONCAKE_BLOCK_TOKENS, Trace

RUNNER = Path(__file__).parent / "dynamo" / "mocker_runner.py"
ROUTER_MODES = ("kv_router", "round_robin")


@dataclass(frozen=True)
class MockerEngine:
    """One mocked worker's engine arguments (AISimulate's `engine` section;
    the mocker's vLLM backend unless `backend` says otherwise)."""

    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    backend: str = "vllm"
    enable_prefix_caching: bool = True

    @classmethod
    def of_plan(cls, plan: PoolPlan) -> MockerEngine:
        """The engine of a kvpool plan: its page size, its one pool's pages, its
        batch limits. A plan of several pools (a hybrid model) needs the mocker's
        `kv_cache_groups`, which this harness does not map yet: ValueError."""
        paged = [g for g in plan.groups if g.kind != "state"]
        if len(plan.groups) != 1 or not paged:
            raise ValueError(
                f"plan of {plan.spec.name} has groups {[g.name for g in plan.groups]}: "
                "only one-pool plans map onto the mocker's num_gpu_blocks"
            )
        limits = plan.limits
        return cls(
            block_size=plan.spec.tokens_per_block,
            num_gpu_blocks=paged[0].pages,
            max_num_seqs=limits.max_batch_size,
            max_num_batched_tokens=limits.max_num_tokens or limits.max_seq_len,
        )

    def args(self, **extra: Any) -> dict[str, Any]:
        return {"engine": {**asdict(self), **extra}}


def with_hashes(trace: Trace) -> Trace:
    """`trace` as the mocker needs it: every request with `hash_ids` (it refuses a
    line without: "trace line 1 is missing hash_ids"), a trace without any
    given fresh ids no other request shares (nothing reused, as kvpool's
    simulator replays a trace without hashes), and times (all at 0 without)."""
    if trace.hash_ids is None:
        ids, fresh = [], 0
        for prompt in trace.prompt_len.tolist():
            n = -(-prompt // MOONCAKE_BLOCK_TOKENS)
            ids.append(tuple(range(fresh, fresh + n)))
            fresh += n
        trace = replace(trace, hash_ids=tuple(ids), hash_block_tokens=MOONCAKE_BLOCK_TOKENS)
    return trace.with_rate(None)


@dataclass(frozen=True)
class MockerRun:
    """The mocker's `summary` dict and the replay's wall time (s)."""

    summary: dict[str, Any]
    wall_s: float


def run_mocker(
    trace: Trace,
    engine: MockerEngine,
    *,
    workers: int = 1,
    router_mode: str = "kv_router",
    prefill_workers: int = 0,
    decode_workers: int = 0,
    kv_transfer_bandwidth_gb_s: float | None = None,
    kv_transfer_bytes_per_token: int | None = None,
    kv_event_lag_ms: float | None = None,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_e2e_ms: float | None = None,
    report_jsonl: Path | None = None,
) -> MockerRun:
    """Replay `trace` on Dynamo's mocker: `workers` aggregated workers, or
    with `prefill_workers` and `decode_workers` > 0 a disaggregated fleet whose
    prefill workers hand each request to a decode worker over a link of
    `kv_transfer_bandwidth_gb_s` (GB/s) at `kv_transfer_bytes_per_token`
    (`kvpool.fleet.bytes_per_token`; both unset: the transfer takes no time).
    `report_jsonl`: the mocker's per-request records (arrival, admission,
    token times, the workers that served it)."""
    if router_mode not in ROUTER_MODES:
        raise ValueError(f"router_mode is one of {ROUTER_MODES}, not {router_mode!r}")
    disaggregated = prefill_workers > 0 or decode_workers > 0
    if disaggregated and (prefill_workers < 1 or decode_workers < 1):
        raise ValueError("a disaggregated fleet needs at least one prefill and one decode worker")
    python = dynamo_python()
    with tempfile.TemporaryDirectory(prefix="kvpool-mocker-") as tmp:
        path = Path(tmp) / "trace.jsonl"
        trace = with_hashes(trace)
        write_mooncake_jsonl(trace, path)
        job: dict[str, Any] = {
            "trace": str(path),
            "trace_block_size": trace.hash_block_tokens,
            "router_mode": router_mode,
            "kv_event_lag_ms": kv_event_lag_ms,
            "sla_ttft_ms": sla_ttft_ms,
            "sla_itl_ms": sla_itl_ms,
            "sla_e2e_ms": sla_e2e_ms,
            "report_jsonl_path": str(report_jsonl) if report_jsonl else None,
        }
        if disaggregated:
            transfer = {
                "kv_transfer_bandwidth": kv_transfer_bandwidth_gb_s,
                "kv_transfer_bytes_per_token": kv_transfer_bytes_per_token,
            }
            job.update(
                prefill_engine=engine.args(worker_type="prefill", **transfer),
                decode_engine=engine.args(worker_type="decode"),
                num_prefill_workers=prefill_workers,
                num_decode_workers=decode_workers,
            )
        else:
            job.update(engine=engine.args(), num_workers=workers)
        done = subprocess.run(
            [str(python), str(RUNNER)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "DYN_LOG": "off"},  # else a log line per routing decision
        )
    if done.returncode:
        raise RuntimeError(f"Dynamo's mocker failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout)
    return MockerRun(out["summary"], out["wall_s"])
