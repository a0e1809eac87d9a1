"""Policy names -> plans, sweep grids, and the synthetic prompts of a trace."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.errors import KvpoolError
from kvpool.plan import ServingLimits
from kvpool.sim.policies import (
    full_ratio,
    parse_policies,
    parse_range,
    plan_for,
    resolve_group,
    sweep_shares,
)
from kvpool.sim.requests import make_sequence, prompt_ids
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.trace import Trace

GiB = 2**30


def gemma() -> ModelSpec:
    return load_model_spec("gemma-3-27b", max_seq_len=8192)


def test_parse_policies_keeps_ratio_commas() -> None:
    assert parse_policies("reference,ratio:full=0.3,sliding=0.7,typical") == [
        "reference",
        "ratio:full=0.3,sliding=0.7",
        "typical",
    ]
    with pytest.raises(KvpoolError, match="unknown policy 'fastest'"):
        parse_policies("reference,fastest")


def test_resolve_group_by_name_or_unique_kind() -> None:
    spec = gemma()
    assert resolve_group(spec, "sliding") == "sliding" and resolve_group(spec, "full") == "full"
    with pytest.raises(KvpoolError, match="no group 'chunked'"):
        resolve_group(spec, "chunked")


def test_partial_ratio_splits_the_rest() -> None:
    spec = gemma()
    assert full_ratio(spec, {"full": 0.3}) == pytest.approx({"full": 0.3, "sliding": 0.7})
    with pytest.raises(KvpoolError, match="leaves nothing"):
        full_ratio(spec, {"full": 1.0})


def test_policies_give_their_plans() -> None:
    spec = gemma()
    limits = ServingLimits(max_batch_size=64, max_seq_len=8192, max_num_tokens=4096, avg_seq_len=2048)
    trace = Trace("t", np.array([1000, 3000]), np.array([100, 200]))
    ref = plan_for(spec, limits, "reference", kv_memory_bytes=20 * GiB)
    assert ref.plan.policy == "reference" and ref.plan.limits.avg_seq_len is None
    typ = plan_for(spec, limits, "typical", kv_memory_bytes=20 * GiB)
    assert typ.plan.policy == "typical_step" and typ.plan.limits.avg_seq_len == 2048 and not typ.notes
    no_s = plan_for(spec, ServingLimits(max_seq_len=8192), "typical", kv_memory_bytes=20 * GiB)
    assert no_s.plan.limits.avg_seq_len == 8192 and "S = max_seq_len = 8192" in no_s.notes[0]
    wl = plan_for(spec, limits, "workload", kv_memory_bytes=20 * GiB, trace=trace)
    assert wl.plan.policy == "workload"
    ratio = plan_for(spec, limits, "ratio:sliding=0.25", kv_memory_bytes=20 * GiB)
    assert ratio.plan.group("sliding").share == pytest.approx(0.25, abs=0.01)
    assert not ratio.plan.constraints
    with pytest.raises(KvpoolError, match="needs a trace"):
        plan_for(spec, limits, "workload", kv_memory_bytes=20 * GiB)
    with pytest.raises(KvpoolError, match="cannot read policy"):
        plan_for(spec, limits, "ratio:sliding", kv_memory_bytes=20 * GiB)


def test_sweep_grids() -> None:
    assert sweep_shares(3) == [0.05, 0.5, 0.95]
    # 0.002 .. 0.2 spans a factor 100: geometric, x 10 per step
    assert sweep_shares(3, 0.002, 0.2) == [0.002, 0.02, 0.2]
    assert parse_range("0.1:0.4") == (0.1, 0.4)
    for bad in ("0.4:0.1", "0:0.5", "x:y", "0.5"):
        with pytest.raises(KvpoolError):
            parse_range(bad)
    with pytest.raises(KvpoolError, match="at least 2 points"):
        sweep_shares(1)


def test_prompt_ids_follow_hash_blocks() -> None:
    trace = Trace(
        "m", np.array([600, 520, 3]), np.array([1, 1, 1]), hash_ids=((0, 1), (0, 7), (5,)), hash_block_tokens=512
    )
    a, b, c = (prompt_ids(trace, i) for i in range(3))
    assert a[:512] == b[:512] == list(range(512))  # shared block 0
    assert a[512:] == list(range(512, 600))  # block 1: ids 512 + 0..87
    assert b[512:] == list(range(7 * 512, 7 * 512 + 8))  # block 7
    assert c == [5 * 512, 5 * 512 + 1, 5 * 512 + 2]
    plain = Trace("p", np.array([4, 4]), np.array([2, 2]))
    d, e = prompt_ids(plain, 0), prompt_ids(plain, 1)  # no hash ids: each prompt its own id, no shared page
    assert len(set(d)) == len(set(e)) == 1 and d != e and min(d + e) > max(a + b + c)


def test_make_sequence_caps_output_and_rejects_long_prompts() -> None:
    trace = Trace("t", np.array([10, 60, 64]), np.array([100, 3, 1]), np.array([0.0, 1.0, 2.0]))
    s = make_sequence(trace, 0, 64)
    assert s is not None and s.max_new_tokens == 54 and s.arrival_s == 0.0  # 10 + 54 = 64
    s = make_sequence(trace, 1, 64)
    assert s is not None and s.max_new_tokens == 3 and s.arrival_s == 1.0
    assert make_sequence(trace, 2, 64) is None
