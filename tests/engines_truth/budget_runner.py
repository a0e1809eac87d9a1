"""Referee: each engine's own default KV budget rule, run in its side venv.

SGLang: `ServerArgs(...).resolve_once()` with the device memory it queries
(`get_device_memory_capacity`, MB) set to each case's, then the
`mem_fraction_static` its resolution declares (`_handle_gpu_memory_settings`).
(vLLM's default utilization is read from its source, tests/test_engines_budgets.py.)
Reads a JSON list of
cases on stdin ({"id", "gpu_mb", "tp", "config"}), writes one result
per case. Imports the engine; never imported by kvpool.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def sglang_fraction(case: dict[str, Any], root: Path) -> float:
    sys.path.insert(0, str(Path(__file__).parent))
    import sglang_runner  # noqa: F401  (its torchvision stub)
    from sglang.srt.arg_groups import memory_hook
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.server_args import ServerArgs

    where = root / case["id"]
    where.mkdir()
    shutil.copy(case["config"], where / "config.json")
    memory_hook.get_device_memory_capacity = lambda device=None: case["gpu_mb"]
    args = ServerArgs(model_path=str(where), tp_size=case["tp"], skip_tokenizer_init=True, device="cuda")
    args.resolve_once()
    return float(resolved_view(args).mem_fraction_static)


def main() -> None:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in json.load(sys.stdin):
            try:
                value = sglang_fraction(case, Path(tmp))
                out.append({"id": case["id"], "value": value})
            except Exception as e:  # reported, not hidden
                out.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
