"""SGLang's own argument parser (in the side venv `make engines-venvs` builds)
reads back the HiCache flags `--emit sglang` gives for a plan's host tier, and
the host pool SGLang would then allocate stays within the planned tier.

SGLang 0.5.23 sizes its host pool per rank from `--hicache-size` in GB:
`int(host_size * 1e9 // size_per_token)` tokens
(sglang/srt/mem_cache/pool_host/base.py), where an MHA model's
`size_per_token` is head_dim x KV heads per rank x layers x (K, V) x dtype bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvpool import ServingLimits, load_model_spec, plan_pools
from kvpool.engines.emit import emit
from kvpool.plan.tiers import GiB, plan_tiers

SGLANG_PY = (
    Path(os.environ.get("KVPOOL_ENGINES_CACHE", Path.home() / ".cache" / "kvpool-engines")) / "sglang-0.5.23/bin/python"
)


@pytest.mark.parametrize("tp", [1, 2])
def test_sglang_parses_its_hicache_flags(tp: int) -> None:
    if not SGLANG_PY.exists():
        if os.environ.get("KVPOOL_ENGINES_REQUIRED"):
            pytest.fail(f"no SGLang side venv at {SGLANG_PY}: run `make engines-venvs`")
        pytest.skip("no SGLang side venv (make engines-venvs)")
    spec = load_model_spec("qwen3-8b", tp_size=tp)
    plan = plan_pools(spec, ServingLimits(max_seq_len=8192, max_batch_size=64), kv_memory_bytes=20 * GiB)
    (host, _) = tiers = plan_tiers(plan, 32 * GiB, 256 * GiB, "even")
    argv = list(emit("sglang", plan, "Qwen/Qwen3-8B", tiers).argv or ())
    script = (
        "import argparse, json, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser()\n"
        "ServerArgs.add_cli_args(p)\n"
        "a = ServerArgs.from_cli_args(p.parse_args(json.loads(sys.argv[1])))\n"
        "print(json.dumps([a.enable_hierarchical_cache, a.hicache_size, a.tp_size]))\n"
    )
    done = subprocess.run(
        [str(SGLANG_PY), "-c", script, json.dumps(argv[3:])], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    enabled, size_gb, tp_size = json.loads(done.stdout.strip().splitlines()[-1])
    assert enabled is True and tp_size == tp
    # Qwen3-8B (config.json): 36 layers, 8 KV heads, head_dim 128, BF16
    per_token = 128 * (8 // tp) * 36 * 2 * 2
    sglang_tokens = int(size_gb * 1e9 // per_token)
    planned_tokens = host.pages[spec.groups[0].name] * spec.tokens_per_block
    assert sglang_tokens <= planned_tokens  # never more host memory than the tier was given
    assert planned_tokens - sglang_tokens <= 1e9 / per_token + spec.tokens_per_block  # whole GB, whole pages
