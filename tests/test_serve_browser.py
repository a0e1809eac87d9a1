"""`kvpool serve` in a real headless Chromium (Debian's chromium + chromium-driver,
installed by `make test`): load the page, read the numbers it shows, change the
inputs as a user would (typing, choosing a GPU, unticking an engine, clicking Fit),
read them again, and compare every number with `kvpool fit --json`; a screenshot
goes to build/kvpool-serve.png.

The browser is driven through chromedriver's W3C WebDriver HTTP API with urllib,
so the test needs no Python package beyond the standard library.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli.serve_cmd import make_server

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "build" / "kvpool-serve.png"  # the last state: layouts and engines for 200 users
FIRST_SCREENSHOT = ROOT / "build" / "kvpool-serve-fit.png"  # the first: qwen3-32b on 2 x H100, all engines
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver element key

if not (CHROMIUM and CHROMEDRIVER):
    if os.environ.get("CI"):  # CI installs them (make browser-setup): missing is a failure there
        raise RuntimeError("chromium and chromedriver are required in CI: make browser-setup")
    pytest.skip("needs chromium and chromedriver (apt-get install chromium chromium-driver)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Browser:
    """A chromedriver session: the few WebDriver commands this test needs."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1900"],
            },
        }
        self.session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["value"]

    def command(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call(method, f"/session/{self.session}{path}", body)

    def run(self, script: str, *args: Any) -> Any:
        return self.command("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css: str) -> str:
        return str(self.command("POST", "/element", {"using": "css selector", "value": css})[ELEMENT])

    def type(self, css: str, text: str) -> None:
        element = self.find(css)
        self.command("POST", f"/element/{element}/clear", {})
        self.command("POST", f"/element/{element}/value", {"text": text})

    def click(self, css: str) -> None:
        self.command("POST", f"/element/{self.find(css)}/click", {})

    def choose(self, select: str, text: str) -> None:
        """Pick the <option> of `select` that reads `text`, by clicking it."""
        xpath = f"//select[@id='{select}']/option[normalize-space(text())='{text}']"
        element = self.command("POST", "/element", {"using": "xpath", "value": xpath})[ELEMENT]
        self.command("POST", f"/element/{element}/click", {})

    def runs(self) -> int:
        return int(self.run("return Number(document.getElementById('status').dataset.runs || 0)"))

    def wait_for_run(self, done: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while self.runs() <= done:
            if time.monotonic() > end:
                raise AssertionError(f"the page did not answer: {self.run('return document.body.innerText')[:500]}")
            time.sleep(0.1)

    def close(self) -> None:
        self.command("DELETE", "")


@pytest.fixture(scope="module")
def page() -> Iterator[tuple[Browser, str]]:
    server = make_server(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = free_port()
    driver = subprocess.Popen(
        [str(CHROMEDRIVER), f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        end = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2)
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
        browser = Browser(port)
        try:
            yield browser, f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            browser.close()
    finally:
        driver.terminate()
        driver.wait(timeout=10)
        server.shutdown()
        server.server_close()


SHOWN = """
const cells = {};
for (const e of document.querySelectorAll('[data-engine][data-field]')) {
  (cells[e.dataset.engine] = cells[e.dataset.engine] || {})[e.dataset.field] = e.textContent;
}
const launches = {};
for (const e of document.querySelectorAll('pre.launch')) launches[e.dataset.engine] = e.textContent;
const parts = {};
for (const e of document.querySelectorAll('[data-part]')) parts[e.dataset.part] = Number(e.dataset.bytes);
const pools = {};
for (const e of document.querySelectorAll('[data-pool]')) pools[e.dataset.pool] = Number(e.dataset.pages);
const held = [...document.querySelectorAll('[data-held]')].map((e) => Number(e.dataset.held));
return {kv: Number(document.getElementById('kv-per-rank').dataset.bytes), cells, launches, parts, pools, held,
        status: document.getElementById('status').textContent};
"""


def check_against_cli(shown: dict[str, Any], fit: dict[str, Any]) -> None:
    """Every number the page shows is the CLI's."""
    assert shown["kv"] == fit["kv_bytes_per_rank"]
    assert shown["pools"] == {p["name"]: p["pages"] for p in fit["pools"]}
    memory = fit["memory"]
    assert shown["parts"]["kv"] == memory["kv_bytes"] and shown["parts"]["weights"] == memory["weights_bytes"]
    assert set(shown["cells"]) == {e["engine"] for e in fit["engines"]}
    for e in fit["engines"]:
        cells = shown["cells"][e["engine"]]
        assert cells["verdict"].startswith(e["verdict"])
        assert cells["budget"] == "  |  ".join(e["budget_flags"])
        for name, count in e["requests_that_fit"].items():
            assert int(cells[f"fit-{name}"]) == count
        assert int(cells["graphs"]) == e["largest_graph_batch"]
        assert shown["launches"][e["engine"]] == e["launch_text"]


def test_the_page_shows_the_clis_numbers_before_and_after_the_inputs_change(
    page: tuple[Browser, str], cli: Any
) -> None:
    browser, url = page
    browser.command("POST", "/url", {"url": url})
    browser.wait_for_run(0)
    shown = browser.run(SHOWN)
    assert shown["status"].startswith("ready"), shown["status"]
    code, out, err = cli(
        "fit", "qwen3-32b", "--gpu", "h100x2", "--max-seq-len", "32768", "--max-batch-size", "256", "--json"
    )
    assert code == 0, err
    check_against_cli(shown, json.loads(out))
    save_screenshot(browser, FIRST_SCREENSHOT)

    # as a user would: one H200, 16k context, fp8 KV, without TensorRT-LLM
    done = browser.runs()
    browser.choose("gpu", "h200")
    browser.type("#count", "1")
    browser.type("#max-seq-len", "16384")
    browser.choose("kv-dtype", "fp8")
    browser.click("#engine-boxes input[value=trtllm]")
    browser.click("#fit")
    browser.wait_for_run(done)
    shown = browser.run(SHOWN)
    code, out, err = cli(
        "fit", "qwen3-32b", "--gpu", "h200", "--max-seq-len", "16384", "--kv-dtype", "fp8",
        "--engine", "vllm,sglang", "--json",
    )  # fmt: skip
    assert code == 0, err
    after = json.loads(out)
    check_against_cli(shown, after)
    assert set(shown["cells"]) == {"vllm", "sglang"} and shown["kv"] != 0

    # the reverse question: 200 users of 8,192 positions on Llama 3.1 70B
    done = browser.runs()
    browser.type("#model", "llama-3.1-70b")
    browser.choose("gpu", "h100")
    browser.choose("kv-dtype", "auto")
    browser.type("#users", "200")
    browser.type("#len", "8192")
    browser.click("#fit")
    browser.wait_for_run(done, timeout=120)
    shown = browser.run(SHOWN)
    code, out, err = cli(
        "fit", "llama-3.1-70b", "--gpu", "h100", "--users", "200", "--len", "8192", "--engine", "vllm,sglang", "--json"
    )
    assert code == 0, err
    users = json.loads(out)
    assert shown["held"] == [x["requests_held"] for x in users["layouts"][:12]] and min(shown["held"]) >= 200
    check_against_cli(shown, users)

    save_screenshot(browser, SCREENSHOT)


def save_screenshot(browser: Browser, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    png = base64.b64decode(browser.command("GET", "/screenshot"))
    assert png.startswith(b"\x89PNG")
    path.write_bytes(png)
