"""Simulator policies engine:vllm / engine:sglang / engine:trtllm."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.engines import sglang, trtllm, vllm
from kvpool.errors import KvpoolError
from kvpool.plan import ServingLimits
from kvpool.sim.engine_policies import vllm_real_share
from kvpool.sim.policies import parse_policies, plan_for
from kvpool.spec import load_model_spec
from kvpool.trace import Trace

GiB = 2**30
LIMITS = ServingLimits(max_seq_len=8192)
TRACE = Trace("t", np.array([1000, 3000, 200]), np.array([100, 200, 50]))


def test_engine_policies_parse() -> None:
    assert parse_policies("engine:vllm,engine:sglang,engine:trtllm,workload") == [
        "engine:vllm",
        "engine:sglang",
        "engine:trtllm",
        "workload",
    ]
    with pytest.raises(KvpoolError, match="engine:vllm"):
        parse_policies("engine:foo")


def test_sglang_and_trtllm_pools_become_pages() -> None:
    spec = load_model_spec("gpt-oss-20b", max_seq_len=8192)
    sg = plan_for(spec, LIMITS, "engine:sglang", kv_memory_bytes=10 * GiB, trace=TRACE).plan
    r = sglang.allocate(spec, LIMITS, 10 * GiB, max_running_requests=256)
    assert sg.pages("full") == r.reported["full_tokens"] // 32
    assert sg.pages("sliding") == r.reported["swa_tokens"] // 32
    assert sg.policy == "engine:sglang"
    tr = plan_for(spec, LIMITS, "engine:trtllm", kv_memory_bytes=10 * GiB, trace=TRACE).plan
    blocks = trtllm.allocate(spec, LIMITS, 10 * GiB).group_pages
    assert blocks is not None and tr.pages("sliding") == blocks["sliding"]


def test_vllm_policy_excludes_padding() -> None:
    spec = load_model_spec("gemma-3-27b", max_seq_len=8192)
    report = vllm.allocate(spec, LIMITS, 10 * GiB)
    assert vllm_real_share(spec, report) == pytest.approx(62 / 70)  # 7 groups of 10, 62 real layers
    pp = plan_for(spec, LIMITS, "engine:vllm", kv_memory_bytes=10 * GiB, trace=TRACE)
    assert pp.plan.total_bytes <= 10 * GiB * 62 / 70
    assert any("padding excluded" in n for n in pp.notes)


def test_engine_that_refuses_is_an_error() -> None:
    spec = load_model_spec("qwen3-next-80b-a3b", max_seq_len=8192)
    with pytest.raises(KvpoolError, match="Mamba cache blocks"):
        plan_for(
            spec,
            ServingLimits(max_seq_len=8192, max_batch_size=512),
            "engine:vllm",
            kv_memory_bytes=4 * GiB,
            trace=TRACE,
        )
