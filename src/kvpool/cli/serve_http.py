"""The HTTP side of `kvpool serve`, hardened as a tool on localhost should be
(what the page computes is cli/serve_cmd.py's):

- **only this server's name**: the Host header must be the bound address
  (127.0.0.1:PORT or localhost:PORT) and an Origin, when sent, its origin, so a
  page on another site that rebinds its DNS name to 127.0.0.1 is refused (403);
  a request the browser marks cross-site (Sec-Fetch-Site) too;
- **bounded**: each connection has `REQUEST_TIMEOUT_S` to send its request (an
  idle or slow one is closed), at most `MAX_CONNECTIONS` are served at once
  (more get 503 at once, without a thread), and a request line past 64 KiB is
  414, a malformed one 400, an HTTP version past 1.1 is 505 — each answered, as
  JSON like every other error;
- **each request on its own**: its errors are its own (nothing process-wide is
  redirected), one access-log line per request on stderr, an internal failure
  a 500 for that request alone;
- **headers**: nosniff, no framing (X-Frame-Options and CSP frame-ancestors), a
  Content-Security-Policy that lets only the page's own script run, no referrer,
  no cache; the Server banner names kvpool, not the Python version.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kvpool import presets
from kvpool.errors import KvpoolError
from kvpool.models.source import HUB_ID

HOST = "127.0.0.1"
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 10.0
_BUSY_BODY = b'{"error": "too many connections open; try again"}'
BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _BUSY_BODY
)


class LocalServer(ThreadingHTTPServer):
    """A threading server on 127.0.0.1:`port` (0: a free one) that serves at
    most `max_connections` connections at once and knows its own names."""

    daemon_threads = True

    def __init__(
        self,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        super().__init__((HOST, port), handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.request_timeout = timeout
        bound = self.server_address[1]
        self.hosts = {f"{HOST}:{bound}", f"localhost:{bound}"}
        self.origins = {f"http://{host}" for host in self.hosts}

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # over the cap: answered at once, no thread started
            with contextlib.suppress(OSError):
                request.sendall(BUSY)
            self.close_after(request, wait=0.0)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.close_after(request, wait=0.5)

    def close_after(self, request: Any, *, wait: float) -> None:
        """Close a connection without losing the answer: unread request bytes (the
        rest of a 70,000-character line) make the kernel reset the connection, and
        the client never reads the 414. So: end the answer, read what the client
        still sends (at most 1 MiB, `wait` seconds), then close."""
        with contextlib.suppress(OSError):
            request.shutdown(socket.SHUT_WR)
            request.settimeout(wait or 0.0)  # 0: only what has arrived
            for _ in range(16):
                if not request.recv(65536):
                    break
        self.close_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def script_hashes(page: bytes) -> str:
    """The CSP sources of `page`'s inline scripts: 'sha256-...' of each."""
    scripts = re.findall(rb"<script>(.*?)</script>", page, re.DOTALL)
    return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s).digest()).decode()}'" for s in scripts)


class LocalHandler(BaseHTTPRequestHandler):
    """The checks, limits and headers above; subclasses answer GET (`do_GET`)."""

    server: LocalServer
    server_version = "kvpool-serve"
    sys_version = ""  # no Python version in the Server header
    # the page's inline scripts by their hashes (`script_hashes`), its inline styles, fetches to itself
    script_sources = "'none'"

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)  # an idle or slow client is closed

    def parse_request(self) -> bool:
        """The stdlib's parse (400, 505 answered there), then the Host / Origin checks."""
        if not super().parse_request():
            return False
        host = self.headers.get("Host")
        if host is None and self.request_version != "HTTP/1.0":
            self.send_error(400, "HTTP/1.1 needs a Host header")
            return False
        if host is not None and host.lower() not in self.server.hosts:
            self.send_error(403, f"Host {host[:80]!r} is not this server ({HOST}:{self.server.server_address[1]})")
            return False
        origin = self.headers.get("Origin")
        if origin is not None and origin.lower() not in self.server.origins:
            self.send_error(403, f"requests from {origin[:80]!r} are not served; open the page from this server")
            return False
        if self.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            self.send_error(403, "cross-site requests are not served")
            return False
        return True

    def end_headers(self) -> None:
        for name, value in (
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            (
                "Content-Security-Policy",
                f"default-src 'none'; script-src {self.script_sources}; style-src 'unsafe-inline'; "
                "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            ("Referrer-Policy", "no-referrer"),
            ("Cross-Origin-Resource-Policy", "same-origin"),
            ("Cross-Origin-Opener-Policy", "same-origin"),
            ("Cache-Control", "no-store"),
        ):
            self.send_header(name, value)
        super().end_headers()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error as JSON `{"error": message}` (the stdlib's is an HTML page), and the connection closed."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # a garbage line: answered with a status line, not as HTTP/0.9
            self.request_version = "HTTP/1.0"
        self.reply_json(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def reply_json(self, status: int, obj: Any) -> None:
        self.reply(status, json.dumps(obj).encode(), "application/json")

    def reply(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and status >= 200 and status not in (204, 304):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """One line per request on stderr: the client, the request line (cut at 200
        characters) and the status. Fields the request never got (a line too
        long to read) are left out, never an error."""
        line = str(getattr(self, "requestline", "") or "-")
        line = line if len(line) <= 200 else line[:197] + "..."
        what = args[1] if format.startswith('"%s"') and len(args) > 1 else (format % args)[:200]
        sys.stderr.write(f"kvpool serve: {self.client_address[0]} {line!r} {what}\n")

    def log_error(self, format: str, *args: Any) -> None:
        self.log_message(format, *args)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError):  # the client left or stalled: its connection ends, nothing else
            self.close_connection = True


def under(models_dir: Path, name: str) -> str | None:
    """The full path of `name` (links followed) if it exists inside `models_dir`, else None."""
    root = models_dir.resolve()
    candidate = (root / name).resolve()  # an absolute `name` stays itself
    inside = candidate == root or root in candidate.parents
    return str(candidate) if inside and candidate.exists() else None


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hugging Face id `org/name[@revision]` and as no local path."""
    match = HUB_ID.fullmatch(name)
    local = name.startswith(("/", ".", "~", "\\")) or name.endswith(".json") or Path(name).exists()
    return match is not None and "--" not in match["repo"] and ".." not in match["repo"] and not local


def checked_model(name: str, models_dir: Path | None) -> str:
    """`name` as the MODEL a request may ask for: a preset, a Hugging Face id
    `org/name[@revision]`, or a folder (or config.json) under `models_dir`, the
    one folder the server was started with (returned as its full path, links
    followed: one that leads out of it is refused). Anything
    else is refused in the same words whether or not it exists, so a request
    learns nothing of the machine's files (`/etc/passwd`, `/dev/stdin` and
    `../` included)."""
    if name.lower() in presets.model_names():
        return name
    inside = None if models_dir is None else under(models_dir, name)
    if inside is not None:
        return inside
    if is_hub_id(name):
        return name
    where = (
        f"a folder under {models_dir}" if models_dir is not None else "no local folder (start with --models-dir DIR)"
    )
    raise KvpoolError(
        f"model must be a preset (kvpool models), a Hugging Face id org/name[@revision] or {where}; got {name[:80]!r}"
    )
