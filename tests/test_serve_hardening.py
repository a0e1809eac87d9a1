"""`kvpool serve` hardened as a local tool (cli/serve_http.py), over real sockets
on loopback: each client gets its own answer (40 parallel bad requests got each
other's errors), only this server's Host and Origin are served (a DNS-rebinding
page could call /api/fit), MODEL is a preset, a Hugging Face id or a folder under
--models-dir (`model=/etc/passwd` told which files exist, `/dev/stdin` hung a
thread), connections are capped and time out, malformed requests get 400 / 414
/ 505, every answer carries the security headers, the banner names no Python;
and a bounded load of mixed requests is answered in full."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from kvpool.cli.serve_cmd import FitServer, make_server

CONFIGS = Path(__file__).parent / "data" / "configs"


@pytest.fixture
def serve() -> Iterator[Callable[..., FitServer]]:
    """Start servers (closed after the test): `serve(models_dir=..., timeout=..., max_connections=...)`."""
    started: list[FitServer] = []

    def start(**kwargs: Any) -> FitServer:
        server = make_server(0, **kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def raw(server: FitServer, data: bytes, timeout: float = 30) -> bytes:
    """Send `data` on a fresh connection; everything the server answers before it closes."""
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def get(server: FitServer, path: str, **headers: str) -> tuple[int, dict[str, str], Any]:
    """GET `path` with the right Host unless `headers` say otherwise: (status, headers, JSON or bytes)."""
    fields = {"Host": f"127.0.0.1:{server.server_address[1]}", **headers}
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in fields.items())
    answer = raw(server, f"GET {path} HTTP/1.1\r\n{head}\r\n".encode())
    top, _, body = answer.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    status = int(lines[0].split()[1])
    names = dict(line.split(": ", 1) for line in lines[1:])
    return status, names, json.loads(body) if names.get("Content-Type") == "application/json" else body


def test_parallel_bad_requests_each_get_their_own_error(
    serve: Callable[..., FitServer], capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve()
    values = [f"-{i + 1}" for i in range(40)]

    def ask(value: str) -> tuple[str, int, Any]:
        status, _, body = get(server, f"/api/fit?model=qwen3-8b&gpu=h100&max_seq_len={value}")
        return value, status, body

    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(ask, values))
    for value, status, body in answers:
        assert status == 400 and f"'{value}'" in body["error"], (value, body)
    log = capsys.readouterr().err
    for value in values:  # the access log names every request, each on its own line
        assert sum(f"max_seq_len={value} HTTP/1.1' 400" in line for line in log.splitlines()) == 1, value


@pytest.mark.parametrize(
    ("headers", "status", "word"),
    [
        ({"Host": "evil.example:80"}, 403, "not this server"),  # DNS rebinding: another name, this address
        ({"Host": "localhost:1"}, 403, "not this server"),
        ({"Origin": "http://evil.example"}, 403, "not served"),
        ({"Sec-Fetch-Site": "cross-site"}, 403, "cross-site"),
    ],
)
def test_only_this_servers_name_and_origin_are_served(
    serve: Callable[..., FitServer], headers: dict[str, str], status: int, word: str
) -> None:
    server = serve()
    code, _, body = get(server, "/api/fit?model=qwen3-8b&gpu=h100", **headers)
    assert code == status and word in body["error"]


def test_the_servers_own_names_are_served(serve: Callable[..., FitServer]) -> None:
    server = serve()
    port = server.server_address[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert get(server, "/api/options", Host=host, Origin=f"http://{host}")[0] == 200
    answer = raw(server, b"GET /api/options HTTP/1.1\r\n\r\n")  # HTTP/1.1 needs a Host
    assert answer.startswith(b"HTTP/1.0 400") and b"Host" in answer


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"garbage\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),
        (b"GET / HTTP/9.9\r\n\r\n", 505),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)) + b"\r\n\r\n", 400),  # TLS to plain HTTP
        (b"DELETE / HTTP/1.1\r\nHost: HOST\r\n\r\n", 501),
    ],
    ids=["garbage", "no-version", "http-9.9", "70000-chars", "tls-hello", "delete"],
)
def test_malformed_requests_get_an_answer(serve: Callable[..., FitServer], request_bytes: bytes, status: int) -> None:
    server = serve()
    answer = raw(server, request_bytes.replace(b"HOST", f"127.0.0.1:{server.server_address[1]}".encode()))
    assert answer.startswith(f"HTTP/1.0 {status} ".encode()), answer[:80]
    assert b"X-Content-Type-Options: nosniff" in answer and b'{"error": ' in answer


def test_every_answer_has_the_security_headers_and_no_python_banner(serve: Callable[..., FitServer]) -> None:
    server = serve()
    for path in ("/", "/api/options", "/api/fit?model=nope&gpu=h100", "/nowhere"):
        _, headers, _ = get(server, path)
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
        csp = headers["Content-Security-Policy"]
        assert (
            "frame-ancestors 'none'" in csp
            and "default-src 'none'" in csp
            and "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
        )
        assert headers["Server"] == "kvpool-serve" and "Python" not in json.dumps(headers)
        assert headers["Cache-Control"] == "no-store" and headers["Referrer-Policy"] == "no-referrer"
    _, headers, page = get(server, "/")
    assert "'sha256-" in headers["Content-Security-Policy"] and b"<script>" in page  # the page's own script runs


MODEL_REFUSED = ["/etc/passwd", "/etc/no-such-file", "/dev/stdin", "../../etc/passwd", "~/.ssh/id_rsa", "x.json", "."]


@pytest.mark.parametrize("model", MODEL_REFUSED)
def test_a_model_outside_presets_hub_ids_and_the_models_dir_is_refused_alike(
    serve: Callable[..., FitServer], model: str
) -> None:
    """The same words whether the file exists or not, at once (no read of /dev/stdin)."""
    server = serve()
    start = time.perf_counter()
    status, _, body = get(server, f"/api/fit?model={quote(model)}&gpu=h100")
    assert (
        status == 400 and body["error"].startswith("model must be a preset") and "does not exist" not in body["error"]
    )
    assert "not valid JSON" not in body["error"] and time.perf_counter() - start < 10


def test_a_folder_under_the_models_dir_is_served_and_nothing_else(
    serve: Callable[..., FitServer], tmp_path: Path, cli: Any
) -> None:
    models = tmp_path / "models"
    (models / "qwen").mkdir(parents=True)
    shutil.copy(CONFIGS / "Qwen3-8B.json", models / "qwen" / "config.json")
    outside = tmp_path / "secret"
    outside.mkdir()
    shutil.copy(CONFIGS / "Qwen3-8B.json", outside / "config.json")
    (models / "escape").symlink_to(outside)  # a link out of the folder
    server = serve(models_dir=models)
    status, _, body = get(server, "/api/fit?model=qwen&gpu=h100&engine=vllm")
    code, out, err = cli("fit", str(models / "qwen"), "--gpu", "h100", "--engine", "vllm", "--json")
    assert status == 200 and code == 0 and body == json.loads(out), err
    assert get(server, f"/api/fit?model={quote(str(models / 'qwen'))}&gpu=h100&engine=vllm")[0] == 200
    for model in ("escape", str(outside), "../secret", "qwen/../../secret"):
        status, _, body = get(server, f"/api/fit?model={quote(model)}&gpu=h100")
        assert status == 400 and f"a folder under {models.resolve()}" in body["error"], (model, body)


def test_idle_connections_time_out_and_the_cap_answers_503(serve: Callable[..., FitServer]) -> None:
    """500 idle connections held 502 threads; now 4 at most, each closed after its timeout."""
    server = serve(timeout=0.5, max_connections=4)
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    time.sleep(0.2)
    assert raw(server, b"GET /api/options HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 503")
    assert [c.recv(16) for c in idle] == [b""] * 4  # each closed by the server after its 0.5 s
    for c in idle:
        c.close()
    time.sleep(0.1)
    assert get(server, "/api/options")[0] == 200


def test_a_bounded_load_of_mixed_requests_is_answered_in_full(serve: Callable[..., FitServer]) -> None:
    """The CI load: 400 requests from 16 clients on loopback (pages, options, fits,
    bad fields, bad names, malformed lines): every one answered with its status."""
    server = serve(max_connections=32)
    port = server.server_address[1]
    cases: list[tuple[bytes, int]] = [
        (b"GET / HTTP/1.1\r\nHost: H\r\n\r\n", 200),
        (b"GET /api/options HTTP/1.1\r\nHost: H\r\n\r\n", 200),
        (b"GET /api/fit?model=qwen3-8b&gpu=h100&engine=vllm HTTP/1.1\r\nHost: H\r\n\r\n", 200),
        (b"GET /api/fit?model=qwen3-8b&gpu=h100&max_seq_len=0 HTTP/1.1\r\nHost: H\r\n\r\n", 400),
        (b"GET /api/fit?model=/etc/passwd&gpu=h100 HTTP/1.1\r\nHost: H\r\n\r\n", 400),
        (b"GET /api/options HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403),
        (b"GET / HTTP/9.9\r\n\r\n", 505),
        (b"garbage\r\n\r\n", 400),
    ]
    work = [cases[i % len(cases)] for i in range(400)]

    def one(case: tuple[bytes, int]) -> bool:
        data, status = case
        for _ in range(50):  # a 503 (over the cap) is retried, as a client would
            answer = raw(server, data.replace(b"Host: H", f"Host: 127.0.0.1:{port}".encode()))
            if not answer.startswith(b"HTTP/1.0 503"):
                break
            time.sleep(0.05)
        return answer.startswith(f"HTTP/1.0 {status} ".encode()) and answer.endswith((b"}", b"</html>\n", b"</html>"))

    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, work))
    assert all(results), results.count(False)
    assert time.perf_counter() - start < 120


def test_a_port_in_use_names_the_flag(serve: Callable[..., FitServer]) -> None:
    """It read "(writing the output)"."""
    server = serve()
    done = subprocess.run(
        [sys.executable, "-m", "kvpool", "serve", "--port", str(server.server_address[1])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--port" in done.stderr and "in use" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
