"""`kvpool serve`: the fit of `kvpool fit` as a web page on localhost.

A stdlib `http.server` (no new dependency) serves one static page (cli/web/fit.html)
and one JSON endpoint, `/api/fit?model=...&gpu=...`, whose body is exactly what
`kvpool fit ... --json` prints: both are `kvpool.deploy.fit(...).to_dict()`, and the
page computes nothing itself, so its numbers are the CLI's by construction. Why not Pyodide: the page would have to ship (or
fetch from a CDN) a ~10 MB Python runtime and kvpool's wheel for the same answer,
and CI has no network; why not ASGI: it would add a server dependency for one
endpoint. The server binds 127.0.0.1 only, and is hardened as a local tool
should be (cli/serve_http.py): its own Host and Origin only, bounded connections
and requests, each request's errors its own, a MODEL limited to presets, Hugging
Face ids and folders under `--models-dir`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvpool import deploy, presets
from kvpool.cli import serve_http
from kvpool.cli.common import checked, fraction, int_at_least, kv_dtype_name, positive_int
from kvpool.cli.plan_args import optional_tokens
from kvpool.cli.serve_http import LocalHandler, LocalServer, checked_model, script_hashes
from kvpool.deploy.gpus import gpu_and_count
from kvpool.errors import KvpoolError

HOST = serve_http.HOST
PAGE = resources.files("kvpool.cli").joinpath("web/fit.html").read_bytes()
# query field -> (reader of its text, `deploy.fit` keyword); MODEL is `model`
FIELDS: dict[str, tuple[Callable[[str], Any], str]] = {
    "gpu": (checked(gpu_and_count), "gpu"),
    "engine": (str, "engines"),
    "max_seq_len": (positive_int, "max_seq_len"),
    "max_batch_size": (positive_int, "max_batch_size"),
    "max_num_tokens": (optional_tokens, "max_num_tokens"),
    "kv_dtype": (checked(kv_dtype_name), "kv_dtype"),
    "memory_fraction": (fraction, "memory_fraction"),
    "tp": (positive_int, "tp"),
    "users": (positive_int, "users"),
    "len": (positive_int, "length"),
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="a web page on localhost: model, GPU, limits and engines in; memory, pools, engines, launch lines out",
        description="Serve kvpool fit as a web page on http://127.0.0.1:PORT/ (stdlib server, localhost only); "
        "/api/fit?model=M&gpu=G answers what `kvpool fit M --gpu G --json` prints.",
    )
    p.add_argument("--port", type=int_at_least(0, 65535), default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument(
        "--models-dir",
        type=models_folder,
        default=None,
        metavar="DIR",
        help="the one folder whose model folders (and config.json files) a request may name; without it, "
        "only presets and Hugging Face ids",
    )
    p.set_defaults(func=run)


def models_folder(text: str) -> Path:
    """An argparse type: an existing folder (`~` expanded), in full."""
    path = Path(text).expanduser()
    if not text.strip() or not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder of model folders, got {text!r}")
    return path.resolve()


def fit_keywords(query: dict[str, str]) -> dict[str, Any]:
    """`deploy.fit`'s keywords from a query string's fields, each read as the CLI
    reads its option (unknown fields refused)."""
    unknown = sorted(set(query) - set(FIELDS) - {"model"})
    if unknown:
        raise KvpoolError(f"unknown field(s) {', '.join(unknown)}; fields: model, {', '.join(FIELDS)}")
    if not query.get("model"):
        raise KvpoolError("give model=NAME (kvpool models)")
    out: dict[str, Any] = {}
    for key, (read, keyword) in FIELDS.items():
        if query.get(key):
            try:
                out[keyword] = read(query[key])
            except (argparse.ArgumentTypeError, KvpoolError) as e:
                raise KvpoolError(f"{key}: {e}") from None
    if "gpu" not in out:
        raise KvpoolError("give gpu=NAME[xN] (kvpool gpus)")
    return out


def fit_json(query: dict[str, str]) -> dict[str, Any]:
    """What `kvpool fit --json` prints for these fields, and `error`: why nothing
    fits, when nothing does. Raises KvpoolError for anything the CLI would refuse."""
    found = deploy.fit(query.get("model", ""), **fit_keywords(query))
    out = found.to_dict()
    if found.error:
        out["error"] = found.error
    return out


def options_json() -> dict[str, Any]:
    from kvpool.engines.registry import NAMES as ENGINES

    return {"models": presets.model_names(), "gpus": presets.gpu_names(), "engines": list(ENGINES)}


class FitServer(LocalServer):
    """The server, with the one folder of local models a request may name."""

    models_dir: Path | None = None


class Handler(LocalHandler):
    """GET / (the page), /api/options, /api/fit?...; nothing else."""

    server: FitServer
    script_sources = script_hashes(PAGE)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            self.reply(200, PAGE, "text/html; charset=utf-8")
        elif url.path == "/api/options":
            self.reply_json(200, options_json())
        elif url.path == "/api/fit":
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if query.get("model"):
                    query["model"] = checked_model(query["model"], self.server.models_dir)
                self.reply_json(200, fit_json(query))
            except KvpoolError as e:
                self.reply_json(400, {"error": str(e)})
            except Exception as e:  # this request's failure alone: said, logged, the server goes on
                self.log_message("internal error: %s: %s", type(e).__name__, str(e)[:200])
                self.reply_json(500, {"error": f"internal error: {type(e).__name__}"})
        else:
            self.reply_json(404, {"error": f"no page {url.path[:200]}"})

    def do_HEAD(self) -> None:
        self.do_GET()


def make_server(port: int, *, models_dir: Path | None = None, **limits: Any) -> FitServer:
    """The server on 127.0.0.1:`port` (0: a free port, `server_address[1]` says
    which); `limits`: `max_connections`, `timeout` (cli/serve_http.py)."""
    server = FitServer(port, Handler, **limits)
    server.models_dir = None if models_dir is None else models_dir.expanduser().resolve()
    return server


def run(args: argparse.Namespace) -> int:
    try:
        server = make_server(args.port, models_dir=args.models_dir)
    except OSError as e:
        raise KvpoolError(
            f"--port {args.port}: cannot listen on {HOST}:{args.port} ({e.strerror}); give another --port, or 0 for a free one"
        ) from None
    print(f"kvpool serve: http://{HOST}:{server.server_address[1]}/ (Ctrl-C to stop)", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvpool-serve-") as empty:
        os.chdir(empty)  # relative names find no file here: a Hugging Face id is never read as a local path
        try:
            server.serve_forever()
        finally:
            server.server_close()
    return 0
