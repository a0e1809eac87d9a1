"""`kvpool simulate --policy online` and `kvpool.sim.online.simulate_online`:
one trace served in segments, re-tuned between them, merged into one run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan, ServingLimits, plan_pools
from kvpool.presets import load_gpu
from kvpool.sim import StepTimeModel, load_weights, simulate
from kvpool.sim.online import simulate_online
from kvpool.sim.sweep import GridError, expand_grid
from kvpool.sim.tuned import FixedRatio
from kvpool.spec import load_model_spec
from kvpool.trace import Trace

GiB = 2**30
BASE = ["--gpu", "h100", "--kv-memory", "2GiB", "--max-seq-len", "4096", "--max-batch-size", "32"]
ARGS = [*BASE, "--max-num-tokens", "2048", "--rate", "inf", "--quiet"]


def shifting() -> tuple[list[int], list[int]]:
    """40 short chats then 40 prompts of about 3k tokens: the best split moves."""
    prompts = [100 + 7 * i for i in range(40)] + [2800 + 5 * i for i in range(40)]
    outputs = [20 + i % 30 for i in range(40)] + [30 + i % 20 for i in range(40)]
    return prompts, outputs


def shifting_file(tmp_path: Path) -> str:
    path = tmp_path / "shift.csv"
    rows = (f"{p},{o}" for p, o in zip(*shifting(), strict=True))
    path.write_text("prompt_len,output_len\n" + "\n".join(rows) + "\n")
    return str(path)


def test_online_json_says_its_segments_shares_and_restarts(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    trace = shifting_file(tmp_path)
    code, out, err = cli("simulate", "gemma-3-27b", *ARGS, "--trace", trace, "--compare", "reference,online", "--json")
    assert code == 0, err
    ref, run = json.loads(out)["runs"]
    assert "online" not in ref and run["policy"] == "online"
    o = run["online"]
    assert o["bounds"] == [0, 20, 40, 60, 80] and len(o["shares"]) == 4 and run["finished"] == 80
    assert o["group"] == "sliding" and 0 < o["reference"] < 1
    switched = [d["switched"] for d in o["decisions"]]
    assert [d["segment"] for d in o["decisions"]] == [1, 2, 3]
    assert o["restarts"] == sum(switched) == sum(a != b for a, b in zip(o["shares"], o["shares"][1:], strict=False))
    assert o["restarts"] >= 1  # the prompts grow fourteen-fold halfway: the split follows
    for d, before, after in zip(o["decisions"], o["shares"][:-1], o["shares"][1:], strict=True):
        assert d["share"] == after and (d["switched"] or after == before)
        assert not d["switched"] or d["gain"] > 1 + o["margin"]
    code, text, err = cli("simulate", "gemma-3-27b", *ARGS, "--trace", trace, "--compare", "reference,online")
    line = next(x for x in text.splitlines() if x.startswith("online:"))
    assert " / ".join(f"{s:.1%}" for s in o["shares"]) in line and f"{o['restarts']} restart(s)" in line
    ratio = run["output_tokens_per_s"] / ref["output_tokens_per_s"]
    assert f"= {ratio:.1%} of the best static run (reference)" in line


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--host-memory", "1GiB"], "cold tiers are simulated with static splits"),
        (["--replicas", "2"], "a fleet runs static splits: drop --policy online"),
    ],
)
def test_online_where_it_cannot_apply_is_one_line_exit_2(cli, tmp_path: Path, extra: list[str], says: str) -> None:  # type: ignore[no-untyped-def]
    trace = shifting_file(tmp_path)
    code, out, err = cli("simulate", "gemma-3-27b", *ARGS, "--trace", trace, "--policy", "online", *extra)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and not out


def test_online_with_hash_lookahead_is_one_line_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    argv = ["--trace", "mooncake-conv", "--max-requests", "10", "--policy", "online", "--hash-lookahead", "1"]
    code, out, err = cli("simulate", "gemma-3-27b", *ARGS, *argv)
    assert code == 2 and "drop rebalance / online" in err and len(err.strip().splitlines()) == 1 and not out


def test_online_in_a_sweep_grid_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    grid = {"model": "gemma-3-27b", "gpu": "h100", "trace": "azure-conv", "kv_memory": "2GiB"}
    with pytest.raises(GridError, match="drop policy online"):
        expand_grid({**grid, "policy": ["reference", "online"]})
    assert len(expand_grid({**grid, "policy": ["reference", "tuned"]})) == 2
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({**grid, "policy": ["reference", "online"]}))
    code, out, err = cli("sweep", str(path))
    assert code == 2 and "drop policy online" in err and len(err.strip().splitlines()) == 1 and not out


@pytest.mark.parametrize("admission", [None, "guaranteed"])
def test_simulate_online_is_its_segments_run_by_hand(admission: str | None) -> None:
    """The merged result equals the stretches of segments on one split, each
    simulated here on its own (with the same admission rule) and added up
    (times shifted by the runs before)."""
    spec = load_model_spec("gemma-3-27b", max_seq_len=4096)
    limits = ServingLimits(max_batch_size=32, max_seq_len=4096, max_num_tokens=2048)
    prompts, outputs = shifting()
    trace = Trace("shift", np.array(prompts), np.array(outputs), np.zeros(len(prompts)))
    model = StepTimeModel.build(spec, load_gpu("h100"), load_weights("gemma-3-27b"))
    kv = 2 * GiB
    result, o = simulate_online(spec, limits, trace, model, kv_memory_bytes=kv, admission=admission)
    assert result.online == o.to_json() and result.policy == "online"

    def plan_at(share: float) -> PoolPlan:  # as `tune` plans a share: the reference ratio, or the share and the rest
        ratio = dict(plan_pools(spec, limits, kv_memory_bytes=kv).ratio)
        if share != o.reference:
            ratio = {o.group: share, "full": 1 - share}
        return plan_pools(spec, limits, kv_memory_bytes=kv, policy=FixedRatio("tuned", ratio))

    stretches = [0] + [k for k in range(1, 4) if o.shares[k] != o.shares[k - 1]] + [4]
    by_hand = []
    for a, b in zip(stretches, stretches[1:], strict=False):
        plan = plan_at(o.shares[a])
        assert plan.share_of(o.group) == pytest.approx(o.shares[a], abs=1e-12)
        by_hand.append(simulate(plan, trace.span(o.bounds[a], o.bounds[b]), model, admission=admission))
    assert len(by_hand) == o.restarts + 1
    assert (
        o.restarts >= 1 or admission is not None
    )  # optimistic: the prompts grow fourteen-fold halfway, the split follows
    assert result.plan == by_hand[0].plan
    assert result.output_tokens == o.output_tokens == sum(r.output_tokens for r in by_hand)
    assert result.makespan_s == pytest.approx(o.makespan_s) == pytest.approx(sum(r.makespan_s for r in by_hand))
    assert result.finished == len(result.requests) == sum(r.finished for r in by_hand) == len(trace)
    assert result.preemptions == sum(r.preemptions for r in by_hand)
    assert np.array_equal(result.ttft_s, np.concatenate([r.ttft_s for r in by_hand]))
    start, done = 0.0, 0  # each run's requests in order, times shifted by the makespans of the runs before it
    for r in by_hand:
        merged = result.requests[done : done + len(r.requests)]
        for got, q in zip(merged, r.requests, strict=True):
            assert (got.rid, got.prompt_len, got.output_len, got.preemptions) == (
                q.rid,
                q.prompt_len,
                q.output_len,
                q.preemptions,
            )
            assert got.finish_s == pytest.approx(q.finish_s + start) and got.ttft_s == pytest.approx(q.ttft_s)
        start, done = start + r.makespan_s, done + len(r.requests)
    for name, u in result.pages.items():
        assert u.peak_used == max(r.pages[name].peak_used for r in by_hand) <= u.total
        assert u.total == max(r.pages[name].total for r in by_hand)


def test_simulate_online_needs_a_request_per_segment() -> None:
    spec = load_model_spec("gemma-3-27b", max_seq_len=4096)
    model = StepTimeModel.build(spec, load_gpu("h100"), load_weights("gemma-3-27b"))
    tiny = Trace("tiny", np.array([100, 200]), np.array([5, 5]), np.zeros(2))
    with pytest.raises(KvpoolError, match="at least 4 requests"):
        simulate_online(spec, ServingLimits(max_seq_len=4096), tiny, model, kv_memory_bytes=GiB)
