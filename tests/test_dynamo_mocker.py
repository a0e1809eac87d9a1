"""The harness for Dynamo 1.6.1's fleet mocker (tests/dynamo_mocker.py): a
kvpool trace and plan replayed by N mocked workers behind Dynamo's router, and
by prefill and decode workers. What is checked is the harness's wiring and
the mocker's own semantics the fleet comparison relies on (docs/fleet.md):
with one worker the router has no choice; fewer pages reuse less; the mocker
charges a handoff exactly kvpool's bytes over the link's bandwidth, added to
TTFT. Needs the Dynamo side venv (`make dynamo-venv`): skipped without it,
required with KVPOOL_ENGINES_REQUIRED=1."""

from __future__ import annotations

import numpy as np
import pytest

from dynamo_mocker import MockerEngine, run_mocker, with_hashes
from kvpool import ServingLimits, load_model_spec, plan_pools
from kvpool.fleet import bytes_per_token, handoff, handoff_seconds
from kvpool.presets import load_link
from kvpool.presets.traces import load_trace
from kvpool.trace import MOONCAKE_BLOCK_TOKENS, Trace

SUMMARY_KEYS = (
    "num_requests",
    "completed_requests",
    "prefix_cache_reused_ratio",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "p99_e2e_latency_ms",
    "output_throughput_tok_s",
    "duration_ms",
)


def qwen3_engine(kv_memory: int = 16 << 30) -> MockerEngine:
    plan = plan_pools(load_model_spec("qwen3-8b"), ServingLimits(max_seq_len=32768), kv_memory_bytes=kv_memory)
    return MockerEngine.of_plan(plan)


def test_the_engine_is_the_plans_pages_and_limits() -> None:
    plan = plan_pools(load_model_spec("qwen3-8b"), ServingLimits(max_seq_len=32768), kv_memory_bytes=16 << 30)
    e = MockerEngine.of_plan(plan)
    assert (e.block_size, e.num_gpu_blocks) == (plan.spec.tokens_per_block, plan.groups[0].pages)
    assert (e.max_num_seqs, e.max_num_batched_tokens) == (256, 8192)
    with pytest.raises(ValueError, match="one-pool plans"):
        MockerEngine.of_plan(plan_pools(load_model_spec("gemma-3-27b"), ServingLimits(), kv_memory_bytes=8 << 30))


def test_a_trace_without_hashes_or_times_gets_unshared_ids_at_time_zero() -> None:
    bare = Trace("bare", np.array([600, 5, 1024]), np.array([3, 4, 5]))
    t = with_hashes(bare)
    assert t.hash_ids == ((0, 1), (2,), (3, 4)) and t.arrival_s is not None and not t.arrival_s.any()
    timed = load_trace("mooncake-conv", max_requests=20)
    assert with_hashes(timed).hash_ids == timed.hash_ids
    assert np.array_equal(with_hashes(timed).arrival_s, timed.arrival_s)  # type: ignore[arg-type]


def test_with_one_worker_the_router_changes_nothing() -> None:
    trace = load_trace("mooncake-conv", max_requests=200)
    engine = qwen3_engine()
    kv = run_mocker(trace, engine, workers=1, router_mode="kv_router").summary
    rr = run_mocker(trace, engine, workers=1, router_mode="round_robin").summary
    # a prompt longer than the worker's pages never completes (one of these 200: 120,633 tokens > 116,480)
    fits = int(np.sum(-(-trace.prompt_len // engine.block_size) <= engine.num_gpu_blocks))
    assert fits == 199
    assert kv["completed_requests"] == rr["completed_requests"] == fits
    assert all(kv[k] == rr[k] for k in SUMMARY_KEYS)


def shorter_than(trace: Trace, tokens: int) -> Trace:
    """The requests of `trace` whose prompt and output fit in `tokens` (the
    mocker stops with "replay invariant violated" when many cannot fit a worker)."""
    keep = np.flatnonzero(trace.prompt_len + trace.output_len <= tokens)
    assert trace.arrival_s is not None and trace.hash_ids is not None
    hashes = tuple(trace.hash_ids[i] for i in keep)
    return Trace(trace.name, trace.prompt_len[keep], trace.output_len[keep], trace.arrival_s[keep], hashes)


def test_fewer_pages_reuse_less_on_first_admission() -> None:
    # `prefix_cache_reused_ratio` also counts a preempted request re-admitted onto its own cached pages, so
    # under eviction pressure it rises; `first_admission_prefix_cache_reused_ratio` is the prompt hit rate
    trace = shorter_than(load_trace("mooncake-conv", max_requests=400), 12_000)
    assert len(trace) > 200
    big = run_mocker(trace, qwen3_engine(16 << 30), workers=2).summary
    small = run_mocker(trace, qwen3_engine(2 << 30), workers=2).summary
    first = "first_admission_prefix_cache_reused_ratio"
    assert small[first] < big[first]
    assert big["prefix_cache_reused_ratio"] == big[first]  # no preemption with 3,640 pages a worker
    assert small["prefix_cache_reused_ratio"] > small[first]
    assert big[first] == pytest.approx(1 - big["committed_prefill_tokens"] / big["total_input_tokens"])


@pytest.mark.parametrize("prompt", [1024, 8192])
def test_the_mocker_charges_kvpools_handoff_over_the_link(prompt: int) -> None:
    # one request: the transfer is the only difference, added to TTFT (Dynamo's full_prompt timing mode)
    spec = load_model_spec("qwen3-8b")
    blocks = tuple(range(-(-prompt // MOONCAKE_BLOCK_TOKENS)))
    one = Trace("one", np.array([prompt]), np.array([64]), np.array([0.0]), (blocks,))
    link = load_link("ib-ndr")
    free = run_mocker(one, qwen3_engine(), prefill_workers=1, decode_workers=1).summary
    paid = run_mocker(
        one,
        qwen3_engine(),
        prefill_workers=1,
        decode_workers=1,
        kv_transfer_bandwidth_gb_s=link.bytes_per_s / 1e9,
        kv_transfer_bytes_per_token=round(bytes_per_token(spec, prompt)),
    ).summary
    expected_ms = handoff_seconds(handoff(spec, prompt), link) * 1e3  # full attention: whole pages = whole tokens
    assert paid["mean_ttft_ms"] - free["mean_ttft_ms"] == pytest.approx(expected_ms, rel=1e-9)
    assert paid["mean_itl_ms"] == pytest.approx(free["mean_itl_ms"], rel=1e-12)  # decode steps unchanged


def test_a_disaggregated_fleet_completes_the_trace() -> None:
    trace = load_trace("mooncake-conv", max_requests=200)
    trace = trace.head(90)  # its 120,633-token prompt is request 97
    s = run_mocker(trace, qwen3_engine(), prefill_workers=1, decode_workers=2, sla_ttft_ms=2000, sla_itl_ms=50).summary
    assert s["completed_requests"] == 90
    assert s["prefill_worker_seconds"] > 0 and s["decode_worker_seconds"] > 0
    assert 0 <= s["goodput_completed_requests"] <= 90


def test_bad_harness_arguments_are_refused() -> None:
    trace = load_trace("mooncake-conv", max_requests=5)
    with pytest.raises(ValueError, match="router_mode"):
        run_mocker(trace, qwen3_engine(), router_mode="random")
    with pytest.raises(ValueError, match="prefill and one decode"):
        run_mocker(trace, qwen3_engine(), prefill_workers=2)
