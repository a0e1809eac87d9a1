"""NVIDIA Dynamo 1.6.1's standalone KV indexer as a referee, on loopback:
`python -m dynamo.indexer` from the side venv (`make dynamo-venv`,
tests/dynamo/dynamo-1.6.1.txt) subscribes to each worker's ZMQ PUB socket and
answers `POST /query` with each worker's matched tokens per tier. And the
traffic the lane replays: multi-turn conversations with shared system prompts
(token ids), whose follow-up turns contain the previous turns' outputs."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import time
import urllib.request
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvpool.cache import KVCacheManager
from kvpool.cache.hashing import extend_hashes, salt_seed

CACHE = Path(os.environ.get("KVPOOL_ENGINES_CACHE", Path.home() / ".cache" / "kvpool-engines"))
DYNAMO_PYTHON = CACHE / "dynamo-1.6.1" / "bin" / "python"
# what Dynamo 1.6.1 logs when it cannot decode a batch or refuses a block (its zmq_wire and radix tree)
REFUSED = re.compile(r"Failed to decode|not published|Failed to find parent|Dropping|rejected|Self-referencing", re.I)


def dynamo_python() -> Path:
    """The side venv's interpreter; skip without it (fail with KVPOOL_ENGINES_REQUIRED=1)."""
    if DYNAMO_PYTHON.exists():
        return DYNAMO_PYTHON
    if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
        pytest.fail("the Dynamo 1.6.1 side venv is missing: run `make dynamo-venv`")
    pytest.skip("no Dynamo 1.6.1 side venv (make dynamo-venv)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class DynamoIndexer:
    """`python -m dynamo.indexer` for workers 0..n-1 at `ports`, its log in `log`."""

    def __init__(self, ports: list[int], block_size: int, log: Path) -> None:
        self.port = free_port()
        self.log = log
        workers = ",".join(f"{w}=tcp://127.0.0.1:{p}" for w, p in enumerate(ports))
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [str(dynamo_python()), "-m", "dynamo.indexer", "--block-size", str(block_size), "--port", str(self.port)]
            + ["--workers", workers, "--model-name", "m", "--threads", "1"],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "warn"},
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.query([1])
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"dynamo.indexer did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.2)

    def query(self, token_ids: list[int]) -> dict[int, tuple[int, int, int]]:
        """Worker -> (gpu, cpu, disk) tokens matched (workers without a match left out)."""
        body = json.dumps({"model_name": "m", "token_ids": token_ids}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/query", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        out = {}
        for worker, hit in answer.get("instances", {}).items():
            out[int(worker)] = (hit.get("gpu", 0), hit.get("cpu", 0), hit.get("disk", 0))
        return out

    def refusals(self) -> list[str]:
        """Log lines where it could not decode a batch or refused a block."""
        return [line for line in self.log.read_text().splitlines() if REFUSED.search(line)]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._out.close()


@dataclass(frozen=True)
class Turn:
    """One request of a conversation: its prompt and the output it generates."""

    conversation: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]


def conversations(seed: int, requests: int, chats: int = 40) -> tuple[list[Turn], list[list[int]]]:
    """`requests` turns of `chats` conversations (each on one of 12 system
    prompts; turn k's prompt = the system prompt, every earlier user message
    and output, and a new user message), interleaved as they would arrive;
    and 200 other prompts: a replayed turn's prompt and output followed by
    another message, a system prompt with a new conversation, or new text."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, 32_000) for _ in range(rng.randrange(lo, hi))]

    systems = [text(40, 130) for _ in range(12)]
    history = [list(rng.choice(systems)) for _ in range(chats)]
    turns: list[Turn] = []
    while len(turns) < requests:
        c = rng.randrange(chats)
        prompt = history[c] + text(15, 80)
        output = text(8, 48)
        turns.append(Turn(c, tuple(prompt), tuple(output)))
        history[c] = prompt + output
    others: list[list[int]] = []
    while len(others) < 200:
        pick = rng.random()
        if pick < 0.6:
            t = rng.choice(turns)
            others.append(list(t.prompt + t.output) + text(1, 40))
        elif pick < 0.85:
            others.append(rng.choice(systems) + text(1, 60))
        else:
            others.append(text(30, 200))
    return turns, others


def block_tiers(manager: KVCacheManager, token_ids: list[int]) -> list[str]:
    """Where each whole page of `token_ids` is in a one-group manager: a
    string of G (GPU), C (host tier), D (disk), empty when nowhere."""
    tpb = manager.tokens_per_block
    hashes: list[int] = []
    extend_hashes(hashes, array("q", token_ids), tpb, salt_seed(None), len(token_ids) // tpb)
    levels = manager.tier.levels() if manager.tier is not None else []
    return [
        ("G" if h in manager.pools[0].cached else "") + "".join(lv.medium[0] for lv in levels if h in lv.held[0])
        for h in hashes
    ]


def staged(tiers: list[str], tpb: int) -> tuple[int, int, int]:
    """Dynamo 1.6.1's per-tier answer for blocks held as `tiers` says (measured
    against its indexer, tests/test_dynamo_indexer.py): its gpu count is the
    leading run of GPU blocks, cpu goes on with the blocks after it that the
    host tier holds, disk with the ones after that on disk. kvpool's own
    answer counts a block in any of the tiers consulted (a cache hit copies
    each block from wherever it is), so the two differ only where a chain's
    blocks are not warm to cold."""
    n = 0
    out = []
    for medium in "GCD":
        while n < len(tiers) and medium in tiers[n]:
            n += 1
        out.append(n * tpb)
    return out[0], out[1], out[2]
