"""What a plain `kvpool simulate` loads: each module here is imported where it
is used, so that a run that does not use it does not pay for it at start-up."""

from __future__ import annotations

import json
import subprocess
import sys

# What one replica's run with a given --kv-memory never uses: a checkpoint's
# weights and their headers (no whole-GPU budget, no --pp), the "did you mean"
# of a misspelt preset name.
NOT_LOADED = (
    "kvpool.models.weights",
    "kvpool.models.safetensors_headers",
    "kvpool.models.remote_headers",
    "difflib",
)


def test_a_plain_simulate_loads_no_module_it_does_not_use() -> None:
    code = (
        "import sys; from kvpool.cli.main import main; "
        "rc = main(['simulate', 'qwen3-8b', '--gpu', 'h100', '--kv-memory', '4GiB', '--max-seq-len', '8192', "
        "'--trace', 'mooncake-conv', '--max-requests', '3', '--json', '--quiet']); "
        f"print(rc, [m for m in {NOT_LOADED!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    result, _, loaded = out.rpartition("\n0 ")
    assert json.loads(result)["runs"] and loaded.strip() == "[]", f"loaded: {loaded}"
