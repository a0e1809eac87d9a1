"""Reading a small JSON file (a model config, a quantization sidecar) without
trusting it: the bytes read are capped, so `/dev/zero` or a multi-GB file fails
fast, and numbers and nesting are bounded (`kvpool.jsonsafe`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpool import jsonsafe
from kvpool.errors import SpecError

# The largest config.json published on the hub is a few hundred KB (per-layer NAS
# block_configs); 16 MiB leaves room for anything real and bounds everything else.
MAX_JSON_BYTES = 16 * 2**20


def read_json(path: Path, what: str = "config file", limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in `path`. Raises `SpecError` naming `what` and `path` when
    the file is missing, unreadable, larger than `limit` bytes, not UTF-8, not
    JSON, or nested too deep to parse."""
    try:
        if path.is_fifo() or path.is_socket():  # opening one blocks until a writer comes, maybe never
            raise SpecError(f"cannot read {what} {path}: a pipe or socket, not a file")
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise SpecError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise SpecError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise SpecError(f"{what} {path} is larger than {limit // 2**20} MiB: not a model config")
    try:
        return jsonsafe.loads(data, constants=True)  # transformers writes Infinity (Nemotron-H's time_step_limit)
    except jsonsafe.JSONValueError as e:
        raise SpecError(f"{what} {path} is {e}" if str(e).startswith("not ") else f"{what} {path}: {e}") from None
