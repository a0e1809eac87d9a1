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
from kvpool.units import format_bytes

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "build" / "kvpool-serve.png"  # the last state: layouts and engines for 200 users
FIRST_SCREENSHOT = ROOT / "build" / "kvpool-serve-fit.png"  # the first: qwen3-32b on 2 x H100, all engines
NONE_SCREENSHOT = ROOT / "build" / "kvpool-serve-none.png"  # no layout of up to 2 GPUs holds 500 users
ERROR_SCREENSHOT = ROOT / "build" / "kvpool-serve-error.png"  # a bad input: the one line
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
const parts = {}, from = {};
for (const e of document.querySelectorAll('[data-part]')) parts[e.dataset.part] = Number(e.dataset.bytes);
for (const e of document.querySelectorAll('[data-from]')) from[e.dataset.from] = e.textContent;
const pools = {};
for (const e of document.querySelectorAll('[data-pool]')) pools[e.dataset.pool] = Number(e.dataset.pages);
const held = [...document.querySelectorAll('[data-held]')].map((e) => Number(e.dataset.held));
// the pictures: each segment's bytes and its drawn width, each bar's whole width
const drawn = (sel) => [...document.querySelectorAll(sel)].map((e) => ({
  key: e.dataset.segment || e.dataset.poolSegment, bytes: Number(e.dataset.bytes),
  width: e.getBoundingClientRect().width, whole: e.parentElement.getBoundingClientRect().width - 2}));
const bars = [...document.querySelectorAll('[data-engine-bar]')].map((e) => ({
  engine: e.dataset.engineBar, length: e.dataset.length, count: e.dataset.count === "" ? null : Number(e.dataset.count),
  width: e.getBoundingClientRect().width, whole: e.parentElement.getBoundingClientRect().width}));
const limits = document.getElementById('limits');
const visible = (id) => { const e = document.getElementById(id); return Boolean(e && e.offsetParent !== null); };
return {kv: Number((document.getElementById('kv-per-rank') || {dataset: {}}).dataset.bytes), cells, launches, parts, from,
        pools, held, memory: drawn('[data-segment]'), poolBar: drawn('[data-pool-segment]'), bars,
        limits: limits ? {...limits.dataset} : null, text: document.body.innerText,
        status: document.getElementById('status').textContent, count: document.getElementById('count').value,
        countPlaceholder: document.getElementById('count').placeholder,
        visible: {result: visible('result'), memory: visible('memory-box'), pools: visible('pools-box'),
                  engines: visible('engines-box'), layouts: visible('layouts-box')},
        hint: document.getElementById('hint').textContent, layoutsHead: document.getElementById('layouts-head').textContent,
        batchDisabled: document.getElementById('max-batch-size').disabled};
"""


def check_pictures(shown: dict[str, Any], fit: dict[str, Any]) -> None:
    """The memory of a rank is one bar of its parts, the pools one bar of their bytes, and
    each engine's bar its count of requests: every width drawn in proportion (to a pixel)."""
    memory = fit["memory"]
    segments = {s["key"]: s for s in shown["memory"]}
    expected = {
        "weights": memory["weights_bytes"],
        "activations": memory["activation_bytes"],
        "cuda_graphs": memory["cuda_graph_bytes"],
        "reserved": memory["reserved_bytes"],
        "kv": memory["kv_bytes"],
        "unused": memory["gpu_bytes"] - int(memory["gpu_bytes"] * memory["utilization"]),
    }
    assert {k: s["bytes"] for k, s in segments.items()} == expected
    assert sum(expected.values()) == memory["gpu_bytes"]  # the bar is the whole GPU
    for s in shown["memory"]:
        assert abs(s["width"] - s["whole"] * s["bytes"] / memory["gpu_bytes"]) <= 1.0, s
    pools = {p["name"]: p["bytes"] for p in fit["pools"]}
    assert {s["key"]: s["bytes"] for s in shown["poolBar"]} == pools
    for s in shown["poolBar"]:
        assert abs(s["width"] - s["whole"] * s["bytes"] / sum(pools.values())) <= 1.0, s
    engines = {e["engine"]: e for e in fit["engines"]}
    for b in shown["bars"]:
        counts = [e["requests_that_fit"].get(b["length"], 0) for e in fit["engines"]]
        assert b["count"] == engines[b["engine"]]["requests_that_fit"][b["length"]]
        assert abs(b["width"] - b["whole"] * b["count"] / max(1, *counts)) <= 1.0, b


def check_against_cli(shown: dict[str, Any], fit: dict[str, Any]) -> None:
    """Every number the page shows is the CLI's, and every number the CLI prints is on the page."""
    assert shown["kv"] == fit["kv_bytes_per_rank"]
    assert shown["pools"] == {p["name"]: p["pages"] for p in fit["pools"]}
    memory = fit["memory"]
    assert shown["parts"]["kv"] == memory["kv_bytes"] and shown["parts"]["weights"] == memory["weights_bytes"]
    assert shown["parts"]["cuda_graphs"] == memory["cuda_graph_bytes"]
    # the sources column: where each part of the memory comes from, as the CLI says it
    how = memory["how"]
    assert {k: shown["from"][k] for k in ("weights", "activations", "cuda_graphs", "reserved")} == {
        "weights": how["weights"],
        "activations": how["activation"],
        "cuda_graphs": how["cuda_graph"],
        "reserved": how["reserved"],
    }
    assert shown["limits"] == {
        "maxSeqLen": str(fit["limits"]["max_seq_len"]),
        "maxBatchSize": str(fit["limits"]["max_batch_size"]),
        "maxNumTokens": str(fit["limits"]["max_num_tokens"]),
    }
    assert set(shown["cells"]) == {e["engine"] for e in fit["engines"]}
    for e in fit["engines"]:
        cells = shown["cells"][e["engine"]]
        assert cells["version"] == e["version_modelled"]
        assert cells["verdict"].startswith(e["verdict"])
        assert cells["budget"] == "  |  ".join(e["budget_flags"])
        own = e["own_default"]  # the KV the engine takes by its own defaults, as the CLI prints it
        said = "-" if own is None else f"{format_bytes(own['kv_bytes_per_rank'])} ({own['rule']})"
        assert cells["own-default"] == said
        for name, count in e["requests_that_fit"].items():
            assert int(cells[f"fit-{name}"]) == count
        assert int(cells["graphs"]) == e["largest_graph_batch"]
        assert cells["graph-note"] == e["cuda_graphs"].split(": ", 1)[1]
        assert shown["launches"][e["engine"]] == e["launch_text"]
    check_pictures(shown, fit)
    assert "NaN" not in shown["text"] and "undefined" not in shown["text"]


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

    # the reverse question: 200 users of 8,192 positions on Llama 3.1 70B; max_seq_len is
    # their length, and the GPU count (1) is cleared as users are typed: the search goes up to 64
    done = browser.runs()
    browser.type("#model", "llama-3.1-70b")
    browser.choose("gpu", "h100")
    browser.choose("kv-dtype", "auto")
    browser.type("#users", "200")
    browser.type("#max-seq-len", "8192")
    browser.click("#fit")
    browser.wait_for_run(done, timeout=120)
    shown = browser.run(SHOWN)
    code, out, err = cli(
        "fit", "llama-3.1-70b", "--gpu", "h100", "--users", "200", "--len", "8192", "--engine", "vllm,sglang", "--json"
    )
    assert code == 0, err
    users = json.loads(out)
    assert shown["held"] == [x["requests_held"] for x in users["layouts"][:12]] and min(shown["held"]) >= 200
    assert shown["layoutsHead"].startswith("Layouts of up to 64 H100-SXM5-80GB that hold 200 requests of 8,192")
    closest = users["closest"]
    assert shown["hint"] == (
        f"fewer GPUs fall short; the closest is {closest['gpus']} GPUs, tp {closest['tp']}, pp {closest['pp']} "
        f"({closest['requests_held']} held)"
    )
    assert shown["batchDisabled"]  # each replica's max_num_seqs is its share of the users
    assert (shown["count"], shown["countPlaceholder"]) == ("", "64")
    check_against_cli(shown, users)
    save_screenshot(browser, SCREENSHOT)

    # a cap the user sets is said, and honoured: 2 GPUs hold none of 500 requests of 32,768
    done = browser.runs()
    browser.type("#count", "2")
    browser.type("#users", "500")
    browser.type("#max-seq-len", "32768")
    browser.click("#fit")
    browser.wait_for_run(done, timeout=120)
    shown = browser.run(SHOWN)
    code, out, err = cli(
        "fit",
        "llama-3.1-70b",
        "--gpu",
        "h100x2",
        "--users",
        "500",
        "--len",
        "32768",
        "--engine",
        "vllm,sglang",
        "--json",
    )
    none = json.loads(out)
    assert code == 2 and not none["layouts"]
    assert shown["status"] == f"no: {err.split('kvpool fit: ', 1)[1].strip()}" and "\n" not in shown["status"]
    assert shown["layoutsHead"].startswith("Layouts of up to 2 H100-SXM5-80GB")
    c = none["closest"]
    assert (
        shown["hint"]
        == f"the most any layout holds: {c['requests_held']} ({c['gpus']} GPUs, tp {c['tp']}, pp {c['pp']})"
    )
    assert shown["visible"] == {"result": True, "memory": False, "pools": False, "engines": False, "layouts": True}
    assert "NaN" not in shown["text"] and "undefined" not in shown["text"]
    save_screenshot(browser, NONE_SCREENSHOT)


def test_a_bad_input_is_one_line_and_no_stale_tables(page: tuple[Browser, str], cli: Any) -> None:
    """The CLI's exit 2 line, alone: nothing of the previous answer, no "NaN GiB"."""
    browser, url = page
    browser.command("POST", "/url", {"url": url})
    browser.wait_for_run(0)
    done = browser.runs()
    browser.type("#model", "llama-3.1-70b")
    browser.choose("gpu", "l40s")
    browser.type("#count", "1")
    browser.type("#max-seq-len", "8192")
    browser.click("#fit")
    browser.wait_for_run(done)
    shown = browser.run(SHOWN)
    code, _, err = cli("fit", "llama-3.1-70b", "--gpu", "l40s", "--max-seq-len", "8192", "--max-batch-size", "256")
    assert code == 2
    message = err.split("error: ", 1)[1].strip()
    assert shown["status"] == f"error: {message}" and "\n" not in shown["status"]
    assert not shown["visible"]["result"]
    assert "NaN" not in shown["text"] and "GiB" not in shown["text"].replace(message, "")
    save_screenshot(browser, ERROR_SCREENSHOT)


def save_screenshot(browser: Browser, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    png = base64.b64decode(browser.command("GET", "/screenshot"))
    assert png.startswith(b"\x89PNG")
    path.write_bytes(png)
