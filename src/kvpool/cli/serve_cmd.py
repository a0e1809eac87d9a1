"""`kvpool serve`: the fit of `kvpool fit` as a web page on localhost.

A stdlib `http.server` (no new dependency) serves one static page (cli/web/fit.html)
and one JSON endpoint, `/api/fit?model=...&gpu=...`, whose body is exactly what
`kvpool fit ... --json` prints: both are `kvpool.deploy.fit(...).to_dict()`, and the
page computes nothing itself, so its numbers are the CLI's by construction. Why not Pyodide: the page would have to ship (or
fetch from a CDN) a ~10 MB Python runtime and kvpool's wheel for the same answer,
and CI has no network; why not ASGI: it would add a server dependency for one
endpoint. The server binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvpool import deploy, presets
from kvpool.cli.common import checked, fraction, int_at_least, kv_dtype_name, positive_int
from kvpool.cli.plan_args import optional_tokens
from kvpool.deploy.gpus import gpu_and_count
from kvpool.errors import KvpoolError

HOST = "127.0.0.1"
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
    p.set_defaults(func=run)


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


class Handler(BaseHTTPRequestHandler):
    """GET / (the page), /api/options, /api/fit?...; nothing else."""

    server_version = "kvpool-serve"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/", "/index.html"):
            page = resources.files("kvpool.cli").joinpath("web/fit.html").read_bytes()
            self.reply(200, page, "text/html; charset=utf-8")
        elif url.path == "/api/options":
            self.reply_json(200, options_json())
        elif url.path == "/api/fit":
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                self.reply_json(200, fit_json(query))
            except KvpoolError as e:
                self.reply_json(400, {"error": str(e)})
        else:
            self.reply_json(404, {"error": f"no page {url.path}"})

    def reply_json(self, status: int, obj: Any) -> None:
        self.reply(status, json.dumps(obj).encode(), "application/json")

    def reply(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # one line per request, on stderr
        sys.stderr.write(f"kvpool serve: {self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")


def make_server(port: int) -> ThreadingHTTPServer:
    """The server on 127.0.0.1:`port` (0: a free port, `server_address[1]` says which)."""
    return ThreadingHTTPServer((HOST, port), Handler)


def run(args: argparse.Namespace) -> int:
    server = make_server(args.port)
    print(f"kvpool serve: http://{HOST}:{server.server_address[1]}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
