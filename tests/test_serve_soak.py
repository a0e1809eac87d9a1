"""The soak run of `kvpool serve` (`make soak`, not CI): a bounded load on
loopback, many requests from many clients at once, valid and not (random
fields and values, foreign Host and Origin headers, paths for MODEL, malformed
and oversized request lines, clients that connect and say nothing). Every
request gets one complete answer with a status it should have; a bad value that
the error quotes is this request's own; no thread or memory is left growing.
Prints the counts per status.

KVPOOL_SOAK=1 runs it; KVPOOL_SOAK_SERVE_REQUESTS (default 20,000) and
KVPOOL_SOAK_SEED (default: the time) size and seed it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import resource
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest

from kvpool.cli.serve_cmd import make_server

pytestmark = pytest.mark.skipif(not os.environ.get("KVPOOL_SOAK"), reason="a soak run: make soak (KVPOOL_SOAK=1)")

FIELDS = ["gpu", "engine", "max_seq_len", "max_batch_size", "max_num_tokens", "kv_dtype", "memory_fraction", "tp"]
GOOD = {"gpu": "h100", "engine": "vllm", "max_seq_len": "8192", "kv_dtype": "fp8", "tp": "1"}
BAD = ["-1", "0", "abc", "1e400", "9" * 5000, "nan", "", "\u00e9", "%00", "h100x99999", "vllm@", "/etc/passwd"]
MODELS = ["qwen3-8b", "llama-3.1-8b-instruct", "nope", "/etc/passwd", "/dev/stdin", "../x", "org/name", "~/x"]


def request(rng: random.Random, port: int) -> tuple[bytes, str | None]:
    """A random request and its marker: a bad value no other request has, which
    only this request's answer may quote."""
    kind = rng.random()
    if kind < 0.05:
        return rng.choice(
            [b"garbage\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"]
        ), None
    host = f"127.0.0.1:{port}" if rng.random() > 0.05 else "evil.example"
    origin = "" if rng.random() > 0.05 else "Origin: http://evil.example\r\n"
    path = rng.choice(["/", "/api/options", "/nowhere"]) if kind < 0.15 else "/api/fit"
    marker = None
    if path == "/api/fit":
        query = {"model": rng.choice(MODELS), **{k: v for k, v in GOOD.items() if rng.random() < 0.7}}
        if rng.random() < 0.5:
            field = rng.choice(FIELDS)
            marker = f"-{rng.randrange(10**9)}"
            query[field] = marker if rng.random() < 0.5 else rng.choice(BAD)
        path += "?" + "&".join(f"{k}={quote(v)}" for k, v in query.items())
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{origin}\r\n".encode(), marker


def send(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_long_loopback_load_is_answered_in_full() -> None:
    n = int(os.environ.get("KVPOOL_SOAK_SERVE_REQUESTS", "20000"))
    seed = int(os.environ.get("KVPOOL_SOAK_SEED", str(int(time.time()))))
    server = make_server(0, timeout=2.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    rng = random.Random(seed)
    work = [request(rng, port) for _ in range(n)]
    markers = {m for _, m in work if m is not None}
    threads_before = threading.active_count()
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    lock = threading.Lock()

    def one(item: tuple[bytes, str | None]) -> None:
        data, marker = item
        for _ in range(100):
            answer = send(port, data)
            if not answer.startswith(b"HTTP/1.0 503"):  # over the connection cap: retried
                break
            time.sleep(0.02)
        head, _, body = answer.partition(b"\r\n\r\n")
        ok = head.startswith(b"HTTP/1.0 ") and b"Content-Length: " + str(len(body)).encode() in head
        status = int(head.split()[1]) if ok else 0
        if ok and b"application/json" in head and status != 200:
            quoted = set(re.findall(r"-\d+", json.loads(body).get("error", ""))) & markers
            ok = quoted <= {marker}  # another request's value in this answer: the answers got mixed
        with lock:
            statuses[status] += 1
            if not ok or status not in (200, 400, 403, 404, 414, 505):
                failures.append(f"{data[:120]!r} -> {answer[:200]!r}")

    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # silent clients, closed by the server
    start = time.perf_counter()
    log = io.StringIO()
    with contextlib.redirect_stderr(log), ThreadPoolExecutor(32) as pool:  # the test's: the access log counted
        list(pool.map(one, work))
    elapsed = time.perf_counter() - start
    answered = [line for line in log.getvalue().splitlines() if line.startswith("kvpool serve: 127.0.0.1 ")]
    assert len(answered) >= n, f"{n - len(answered)} requests left no access-log line"
    assert all(c.recv(1) == b"" for c in idle)
    for c in idle:
        c.close()
    time.sleep(0.5)
    server.shutdown()
    server.server_close()
    rss_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"\nserve soak: {n:,} requests (seed {seed}) in {elapsed:.0f} s, "
        + ", ".join(f"{statuses[s]:,} x {s}" for s in sorted(statuses))
        + f", {len(failures)} failures, {len(answered):,} access-log lines; threads {threads_before} -> {threading.active_count()}; "
        f"peak RSS {rss_start / 1024:.0f} -> {rss_end / 1024:.0f} MiB"
    )
    assert not failures, f"seed {seed}: " + "\n".join(failures[:20])
    assert threading.active_count() <= threads_before + 1
