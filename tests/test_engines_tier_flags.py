"""Each engine's flags for a plan's cold tiers (`engines/emit.py` add_tiers):
the values follow from the tier per rank and the engine's own unit, and vLLM's
own argument parser (in the side venv the engines lane builds) reads them back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpool import ServingLimits, load_model_spec, plan_pools
from kvpool.engines.emit import emit
from kvpool.plan.tiers import GiB, plan_tiers

VLLM_PY = (
    Path(os.environ.get("KVPOOL_ENGINES_CACHE", Path.home() / ".cache" / "kvpool-engines")) / "vllm-0.32/bin/python"
)


def planned(tp: int) -> Any:
    spec = load_model_spec("qwen3-8b", tp_size=tp)
    plan = plan_pools(spec, ServingLimits(max_seq_len=8192, max_batch_size=64), kv_memory_bytes=20 * GiB)
    return plan, plan_tiers(plan, 32 * GiB, 256 * GiB, "even")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_engine_states_the_host_tier_in_its_own_unit(tp: int) -> None:
    plan, tiers = planned(tp)
    vllm = emit("vllm", plan, "Qwen/Qwen3-8B", tiers)
    assert vllm.argv is not None
    i = vllm.argv.index("--kv-offloading-size")
    assert float(vllm.argv[i + 1]) == 32 * tp  # GiB summed over the TP ranks
    assert vllm.argv[vllm.argv.index("--kv-offloading-backend") + 1] == "native"
    sglang = emit("sglang", plan, "Qwen/Qwen3-8B", tiers)
    assert sglang.argv is not None and "--enable-hierarchical-cache" in sglang.argv
    assert int(sglang.argv[sglang.argv.index("--hicache-size") + 1]) == 32 * GiB // 10**9  # GB per rank
    trt = emit("trtllm", plan, "Qwen/Qwen3-8B", tiers)
    assert trt.config is not None and trt.config["kv_cache_config"]["host_cache_size"] == 32 * GiB
    for e in (vllm, sglang, trt):  # none of them takes a disk size: each says so
        assert any("disk" in n.lower() for n in e.notes)
    assert emit("vllm", plan, "Qwen/Qwen3-8B").argv == vllm.argv[: vllm.argv.index("--kv-offloading-backend")]


def test_vllm_parses_its_offloading_flags() -> None:
    if not VLLM_PY.exists():
        if os.environ.get("KVPOOL_ENGINES_REQUIRED"):
            pytest.fail(f"no vLLM side venv at {VLLM_PY}: run `make engines-venvs`")
        pytest.skip("no vLLM side venv (make engines-venvs)")
    plan, tiers = planned(2)
    argv = list(emit("vllm", plan, "Qwen/Qwen3-8B", tiers).argv or ())
    flags = argv[argv.index("--kv-offloading-backend") :]
    script = (
        "import json, sys\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "from vllm.engine.arg_utils import EngineArgs\n"
        "p = EngineArgs.add_cli_args(FlexibleArgumentParser())\n"
        "e = EngineArgs.from_cli_args(p.parse_args(['--model', 'Qwen/Qwen3-8B', *json.loads(sys.argv[1])]))\n"
        "print(json.dumps([e.kv_offloading_size, e.kv_offloading_backend]))\n"
    )
    done = subprocess.run([str(VLLM_PY), "-c", script, json.dumps(flags)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    size, backend = json.loads(done.stdout.strip().splitlines()[-1])
    assert (size, backend) == (64.0, "native")  # 32 GiB per rank x TP 2
