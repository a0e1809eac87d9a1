"""`kvpool serve`'s endpoints over real HTTP on localhost: the page, the options,
and /api/fit answering exactly what `kvpool fit --json` prints."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kvpool import presets
from kvpool.cli.serve_cmd import HOST, make_server


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = make_server(0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{HOST}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_fit_endpoint_is_the_cli_json(base: str, cli: Any) -> None:
    status, body = get(f"{base}/api/fit?model=gemma-3-27b&gpu=h100x2&max_seq_len=16384&engine=vllm,sglang")
    assert status == 200
    code, out, err = cli(
        "fit", "gemma-3-27b", "--gpu", "h100x2", "--max-seq-len", "16384", "--engine", "vllm,sglang", "--json"
    )
    assert code == 0, err
    assert json.loads(body) == json.loads(out)


def test_users_query_is_the_cli_json(base: str, cli: Any) -> None:
    status, body = get(f"{base}/api/fit?model=llama-3.1-70b&gpu=h100&users=200&len=8192&engine=vllm")
    code, out, _ = cli(
        "fit", "llama-3.1-70b", "--gpu", "h100", "--users", "200", "--len", "8192", "--engine", "vllm", "--json"
    )
    assert status == 200 and json.loads(body) == json.loads(out)


def test_page_and_options(base: str) -> None:
    status, page = get(base + "/")
    assert status == 200 and b"/api/fit" in page and b'id="engines"' in page
    status, body = get(base + "/api/options")
    options = json.loads(body)
    assert options["models"] == presets.model_names() and options["gpus"] == presets.gpu_names()
    assert options["engines"] == ["vllm", "sglang", "trtllm"]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/api/fit?model=qwen3-8b&gpu=h100&bogus=1", 400, "unknown field(s) bogus"),
        ("/api/fit?gpu=h100", 400, "give model=NAME"),
        ("/api/fit?model=qwen3-8b&gpu=h100&max_seq_len=-3", 400, "expected a positive integer"),
        ("/api/fit?model=qwen3-8b&gpu=nope", 400, "unknown gpu preset 'nope'"),
        ("/api/fit?model=llama-3.1-70b&gpu=l40s", 400, "no memory left for the KV cache"),
        ("/etc/passwd", 404, "no page /etc/passwd"),
    ],
)
def test_bad_requests_say_why(base: str, path: str, status: int, message: str) -> None:
    code, body = get(base + path)
    assert code == status and message in json.loads(body)["error"]
