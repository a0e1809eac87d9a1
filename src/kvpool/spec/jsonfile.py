"""Reading a small JSON file (a model config, a quantization sidecar) without
trusting it: the bytes read are capped, so `/dev/zero` or a multi-GB file fails
fast, and nesting deep enough to exhaust the parser is an error, not a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
        return json.loads(data.decode("utf-8-sig"), parse_int=_bounded_int)
    except UnicodeDecodeError as e:
        raise SpecError(f"{what} {path} is not UTF-8 text: {e}") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} {path} is not valid JSON: {e}") from None
    except SpecError as e:  # an integer too long to be a count (_bounded_int)
        raise SpecError(f"{what} {path}: {e}") from None
    except RecursionError:
        raise SpecError(f"{what} {path} is nested too deeply to be a model config") from None


def _bounded_int(text: str) -> int:
    """A JSON integer of at most 30 digits: past that no count in a config is real,
    and thousands of digits pass Python's int-string limit (an untyped ValueError)."""
    if len(text.lstrip("-")) > 30:
        raise SpecError(f"an integer of {len(text.lstrip('-'))} digits ({text[:12]}...) is not a config value")
    return int(text)
