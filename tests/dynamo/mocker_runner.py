"""Referee: NVIDIA Dynamo 1.6.1's fleet mocker (`dynamo._core.run_mocker_trace_replay`,
in-process Rust), run in the Dynamo side venv (tests/dynamo_mocker.py starts it).

Reads one JSON job on stdin: `trace` (a Mooncake JSONL path), `trace_block_size`,
and either `engine` (aggregated: `num_workers`) or `prefill_engine` and
`decode_engine` (disaggregated: `num_prefill_workers`, `num_decode_workers`),
each an AISimulate engine config (`{"engine": {...}}`); `router_mode`
(`kv_router` or `round_robin`) and the optional `kv_event_lag_ms`, `sla_*_ms`,
`arrival_speedup_ratio`, `report_jsonl_path`. Writes one JSON object: the
mocker's `summary` dict as it returns it, and the replay's wall time.

This file imports Dynamo and is never imported by kvpool or its tests.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from dynamo._core import run_mocker_trace_replay

OPTIONAL = ("kv_event_lag_ms", "sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms", "arrival_speedup_ratio", "report_jsonl_path")


def main() -> None:
    job: dict[str, Any] = json.load(sys.stdin)
    kwargs: dict[str, Any] = {k: job[k] for k in OPTIONAL if job.get(k) is not None}
    if "engine" in job:
        kwargs.update(extra_engine_args=job["engine"], num_workers=job["num_workers"])
    else:
        kwargs.update(
            prefill_engine_args=job["prefill_engine"],
            decode_engine_args=job["decode_engine"],
            num_prefill_workers=job["num_prefill_workers"],
            num_decode_workers=job["num_decode_workers"],
        )
    start = time.perf_counter()
    result = run_mocker_trace_replay(
        [job["trace"]], router_mode=job["router_mode"], trace_block_size=job["trace_block_size"], **kwargs
    )
    wall = time.perf_counter() - start
    json.dump({"summary": result.summary, "wall_s": wall}, sys.stdout)


if __name__ == "__main__":
    main()
