"""kvpool's KV events and engine-native hashes against vLLM's own code, run in
vLLM's side venvs (`make engines-venvs`: 0.32 and 0.33;
tests/engines_truth/vllm_kv_runner.py):

- every batch kvpool publishes (hybrid models, state snapshots, host and disk
  tiers, salts and LoRA scopes, both encodings, fetched from the publisher's
  replay socket) decodes with vLLM's `KVEventBatch` classes, and each field
  vLLM reads is the value kvpool meant;
- `hash="vllm:sha256_cbor"` (default seed, and PYTHONHASHSEED) and
  `"vllm:xxhash_cbor"` (PYTHONHASHSEED) give vLLM's request block hasher's
  hashes on 1,200 random (prompt, page size, salt) cases, and the events carry
  them as vLLM's external hashes;
- with lookahead digests (`hash_lookahead=L`, vLLM 0.33's
  `num_hash_lookahead_tokens`) the batches decode with vLLM 0.33's classes,
  `lookahead_token_ids` naming the ids after each block, and the hashes equal
  vLLM 0.33's hasher of that lookahead.

Skipped without the side venv, required with KVPOOL_ENGINES_REQUIRED=1.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

from cache_helpers import hybrid_spec  # noqa: E402
from engines_truth.lane import CACHE  # noqa: E402
from kvpool.cache import KVCacheManager, TierSpec  # noqa: E402
from kvpool.cache.events import MASK64  # noqa: E402
from kvpool.cache.hashing import ReuseScope  # noqa: E402
from kvpool.cache.kv_wire import REMOVED_FIELDS, STORED_FIELDS, wire_events  # noqa: E402
from kvpool.cache.publisher import END_SEQ, KVEventPublisher  # noqa: E402
from kvpool.media import Medium  # noqa: E402
from kvpool.plan import PoolPlan, ServingLimits  # noqa: E402
from kvpool.spec import load_model_spec  # noqa: E402

RUNNER = Path(__file__).parent / "engines_truth" / "vllm_kv_runner.py"
VERSIONS = ["vllm-0.32", "vllm-0.33"]
TPB = 16


def side_python(version: str) -> Path:
    python = CACHE / version / "bin" / "python"
    if python.exists():
        return python
    if os.environ.get("KVPOOL_ENGINES_REQUIRED") == "1":
        pytest.fail(f"the {version} side venv is missing: run `make engines-venvs`")
    pytest.skip(f"no {version} side venv")


def run_vllm(version: str, job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The runner's answer; xxhash (which vLLM's venv lacks) is lent from kvpool's venv, as a
    symlinked package: vLLM's own xxhash_cbor then calls it."""
    import xxhash

    shim = tmp / "shim"
    shim.mkdir(exist_ok=True)
    if not (shim / "xxhash").exists():
        (shim / "xxhash").symlink_to(Path(xxhash.__file__).parent)
    done = subprocess.run(
        [str(side_python(version)), str(RUNNER)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        env={**os.environ, "PYTHONPATH": str(shim), "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


# ----------------------------------------------------------------------------- what kvpool publishes

SALTS: list[Any] = [None, "tenant-a", ReuseScope("tenant-a", "adapter-1"), ReuseScope(lora="adapter-2"), 5]


def published(wire: str, lookahead: int = 0) -> tuple[list[bytes], list[list[Any]]]:
    """Every payload a kvpool publisher sends on a hybrid, tiered, salted
    workload (from its replay socket), and the events it meant (wire_events);
    `lookahead`: the manager's `hash_lookahead`."""
    spec = hybrid_spec(tpb=TPB, window=48)
    plan = PoolPlan.from_pages(spec, {"full": 24, "sliding": 24, "linear_state": 6}, ServingLimits(max_seq_len=2048))
    page = sum(g.slot_bytes for g in spec.groups)
    tiers = [TierSpec(Medium.CPU, 12 * page), TierSpec(Medium.DISK, 12 * page)]
    m = KVCacheManager(plan, tiers=tiers, state_snapshots=True, hash_lookahead=lookahead)
    rng = random.Random(11)
    meant: list[list[Any]] = []
    ctx = zmq.Context.instance()
    with KVEventPublisher("tcp://127.0.0.1:*", m.groups, replay_endpoint="tcp://127.0.0.1:*", wire=wire) as pub:  # type: ignore[arg-type]
        pub.publish_cleared()
        meant.append([["AllBlocksCleared"] if wire == "array" else {"type": "AllBlocksCleared"}])
        prefixes = [[rng.randrange(1, 50_000) for _ in range(rng.randrange(16, 70))] for _ in range(3)]
        for rid in range(30):
            prompt = rng.choice(prefixes) + [rng.randrange(1, 50_000) for _ in range(rng.randrange(1, 40))]
            m.create(rid, prompt, salt=rng.choice(SALTS))
            if m.resize(rid, len(prompt) + 8, len(prompt)):
                m.commit(rid, len(prompt))
                for n in range(len(prompt) + 1, len(prompt) + 8):
                    m.resize(rid, len(prompt) + 8, n)
                    m.commit(rid, n, (rng.randrange(1, 50_000),))
            m.free(rid)
            events = m.take_events()
            if events:
                meant.append(wire_events(events, m.groups, wire))  # type: ignore[arg-type]
                pub.publish(events)
        dealer = ctx.socket(zmq.DEALER)
        try:
            dealer.connect(pub.replay_endpoint)
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            payloads: list[bytes] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pub.serve_replay(timeout_ms=50)
                if dealer.poll(50):
                    _, seq, payload = dealer.recv_multipart()
                    if seq == END_SEQ:
                        break
                    payloads.append(payload)
        finally:
            dealer.close(linger=0)
    assert len(payloads) == len(meant) == pub.next_seq
    return payloads, meant


def as_map(event: Any) -> dict[str, Any]:
    """kvpool's event (either encoding) as {field: value}, tuples as lists."""
    if isinstance(event, dict):
        mapped: dict[str, Any] = json.loads(json.dumps(event))
        return mapped
    tag, values = event[0], event[1:]
    names = {"BlockStored": STORED_FIELDS[0], "BlockRemoved": REMOVED_FIELDS[0]}.get(tag, ())
    return {"type": tag, **json.loads(json.dumps(dict(zip(names, values, strict=False))))}


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    payloads = {wire: published(wire) for wire in ("map", "array")}
    return {
        "payloads": payloads,
        "decode": [{"wire": w, "payloads": [p.hex() for p in payloads[w][0]]} for w in ("map", "array")],
        "hash": HASH_CASES,
    }


@pytest.fixture(scope="module", params=VERSIONS)
def vllm(request: pytest.FixtureRequest, job: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    side_python(request.param)
    answer = run_vllm(request.param, {"decode": job["decode"], "hash": job["hash"]}, tmp_path_factory.mktemp("v"))
    return job, answer


def test_every_batch_kvpool_publishes_decodes_with_vllms_classes(vllm: Any) -> None:
    job, answer = vllm
    assert_decoded_as_meant(job["payloads"], answer["decode"])


def assert_decoded_as_meant(payloads: dict[str, Any], decoded_jobs: list[Any]) -> None:
    """Every batch vLLM decoded holds the events kvpool meant, field by field (vLLM's defaults elsewhere)."""
    for (wire, (_, meant)), decoded in zip(payloads.items(), decoded_jobs, strict=True):
        assert len(decoded) == len(meant) > 10
        kinds = set()
        for batch, events in zip(decoded, meant, strict=True):
            assert "error" not in batch, (wire, batch)
            assert batch["rank"] == 0 and abs(batch["ts"] - time.time()) < 3600
            assert len(batch["events"]) == len(events)
            for theirs, ours in zip(batch["events"], events, strict=True):
                ours = as_map(ours)
                kinds.add(ours["type"])
                for name, value in ours.items():
                    assert theirs[name] == value, (wire, name, theirs, ours)
                for name in set(theirs) - set(ours):
                    assert theirs[name] is None, (wire, name, theirs)  # vLLM's defaults where kvpool omits
        assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


# ----------------------------------------------------------------------------- vLLM's block hashes


def hash_cases(count: int, seed: int) -> list[dict[str, Any]]:
    """Random (algorithm, seed, page size, prompt, salt): token ids of every CBOR width."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        algorithm, env = [("sha256_cbor", None), ("sha256_cbor", "7"), ("xxhash_cbor", "0")][i % 3]
        widths = [24, 256, 65_536, 1 << 32, 1 << 40]
        prompt = [rng.randrange(rng.choice(widths)) for _ in range(rng.randrange(1, 260))]
        salt = rng.choice([None, "", "tenant-a", "ü-" + str(rng.randrange(10**6)), "x" * rng.randrange(1, 300)])
        out.append(
            {
                "algorithm": algorithm,
                "seed": env,
                "block_size": rng.choice([16, 32, 64]),
                "prompt": prompt,
                "salt": salt,
                "lookahead": 0,
            }
        )
    return out


HASH_CASES = hash_cases(1200, seed=36)


@functools.cache
def plan_of(block_size: int) -> PoolPlan:
    spec = load_model_spec("llama-3.1-8b-instruct", tokens_per_block=block_size)
    return PoolPlan.from_pages(spec, {"full": 20}, ServingLimits(max_seq_len=1024))


def kvpool_hashes(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """(page digests, the stored events' hashes as vLLM's external ints) of a
    prompt under `hash="vllm:..."`, through the manager's own path."""
    if case["seed"] is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", case["seed"])
    m = KVCacheManager(plan_of(case["block_size"]), hash=f"vllm:{case['algorithm']}", hash_lookahead=case["lookahead"])
    prompt = case["prompt"]
    m.create(0, prompt, salt=case["salt"])
    assert m.resize(0, len(prompt), len(prompt))
    m.commit(0, len(prompt))
    events = [e for e in wire_events(m.take_events(), m.groups) if e["type"] == "BlockStored"]
    return list(m.requests.get(0).hashes), [h for e in events for h in e["block_hashes"]]


def test_vllm_hashes_equal_vllms_block_hasher(vllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    job, answer = vllm
    assert len(job["hash"]) >= 1000
    blocks = 0
    for case, theirs in zip(job["hash"], answer["hash"], strict=True):
        digests, external = kvpool_hashes(case, monkeypatch)
        assert [d.to_bytes(len(theirs[0]) // 2, "big").hex() for d in digests] == theirs, case
        assert external == [int(h, 16) & MASK64 for h in theirs]  # as vLLM's events carry them
        blocks += len(theirs)
    assert blocks > 2000


def test_xxhash_cbor_without_a_shared_seed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpool.cache import CacheUsageError

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    plan = PoolPlan.from_pages(load_model_spec("llama-3.1-8b-instruct"), {"full": 4}, ServingLimits(max_seq_len=64))
    with pytest.raises(CacheUsageError, match="PYTHONHASHSEED"):
        KVCacheManager(plan, hash="vllm:xxhash_cbor")
    with pytest.raises(CacheUsageError, match="hash must be"):
        KVCacheManager(plan, hash="vllm:md5")
    m = KVCacheManager(plan, hash="vllm:sha256_cbor")
    with pytest.raises(CacheUsageError, match="str cache salt"):
        m.create(0, [1, 2, 3], salt=7)
    with pytest.raises(CacheUsageError, match="LoRA"):
        m.create(1, [1, 2, 3], salt=ReuseScope("t", "adapter"))


# ----------------------------------------------------------------------------- lookahead hashes (vLLM 0.33)


def test_lookahead_events_and_hashes_are_vllm_0_33s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hash_lookahead=L`: every batch decodes with vLLM 0.33's classes with `lookahead_token_ids` as meant,
    each block's L ids are the ids after it, and `hash="vllm:..."` equals vLLM 0.33's block hasher of
    `num_hash_lookahead_tokens=L` (EAGLE: 1, MTP: the draft length)."""
    side_python("vllm-0.33")
    payloads = {wire: published(wire, lookahead=2) for wire in ("map", "array")}
    cases = [dict(case, lookahead=1 + i % 3) for i, case in enumerate(hash_cases(240, seed=39))]
    job = {"decode": [{"wire": w, "payloads": [p.hex() for p in payloads[w][0]]} for w in payloads], "hash": cases}
    answer = run_vllm("vllm-0.33", job, tmp_path)
    assert_decoded_as_meant(payloads, answer["decode"])
    stored = [e for batch in answer["decode"][0] for e in batch["events"] if e["type"] == "BlockStored"]
    assert stored and all(len(e["lookahead_token_ids"]) == len(e["block_hashes"]) for e in stored)
    follows = 0
    for e in stored:
        size, ids, ahead = e["block_size"], e["token_ids"], e["lookahead_token_ids"]
        assert all(len(a) == 2 for a in ahead)
        for i in range(len(e["block_hashes"]) - 1):  # within a run, block i's lookahead opens block i + 1
            assert ahead[i] == ids[(i + 1) * size : (i + 1) * size + 2]
            follows += 1
    assert follows > 10
    blocks = 0
    for case, theirs in zip(cases, answer["hash"], strict=True):
        digests, external = kvpool_hashes(case, monkeypatch)
        assert [d.to_bytes(len(theirs[0]) // 2, "big").hex() for d in digests] == theirs, case
        assert external == [int(h, 16) & MASK64 for h in theirs]
        blocks += len(theirs)
    assert blocks > 400


# ----------------------------------------------------------------------------- a router's index of lookahead stores


def index_cases(count: int, seed: int) -> list[dict[str, Any]]:
    """Traffic for vLLM 0.33's own cache (the runner's `cache` job): prompts on
    a few shared prefixes that part at random places (block boundaries among
    them, where only the lookahead ids tell two prompts apart), salted or not,
    decoded a few ids, freed a few requests later, in a pool small enough to
    evict; queries on the same prefixes."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        bs, vocab = rng.choice([2, 4, 8]), rng.choice([3, 40])  # a tiny vocabulary: prompts agree on long runs

        def ids(lo: int, hi: int, vocab: int = vocab) -> list[int]:
            return [rng.randrange(1, vocab + 1) for _ in range(rng.randrange(lo, hi))]

        prefixes = [ids(bs, 6 * bs) for _ in range(3)]
        salts = [None, "tenant-a"]
        requests = [
            {
                "prompt": rng.choice(prefixes) + ids(0, 2 * bs),
                "salt": rng.choice(salts),
                "decode": ids(0, 2 * bs),
                "stay": rng.randrange(0, 3),
            }
            for _ in range(rng.randrange(5, 25))
        ]
        requests = [r for r in requests if r["prompt"]]
        queries = [{"prompt": rng.choice(prefixes) + ids(0, 2 * bs), "salt": rng.choice(salts)} for _ in range(20)]
        num_blocks = rng.choice([12, 40, 200])
        out.append(
            {
                "block_size": bs,
                "lookahead": i % 4,
                "num_blocks": num_blocks,
                "requests": requests,
                "queries": queries,
            }
        )
    return out


def test_the_index_of_vllm_0_33s_stores_answers_its_prefix_cache(tmp_path: Path) -> None:
    """vLLM 0.33's own `KVCacheManager` with `num_hash_lookahead_tokens=L` (0 to 3) serves random traffic;
    its events, read as a router reads them, make `PrefixIndex` answer each query with the tokens vLLM's
    own prefix cache holds for that prompt (its `find_longest_cache_hit`):

    - though a block's hash there covers the L ids after it: the index keys a block on its ids and its
      `lookahead_token_ids`, and a prompt's block counts only when the prompt goes on with those ids;
    - though vLLM caches a second copy of a block that fills again with a hash it holds, and removes
      each copy with its own `BlockRemoved`: the index counts the copies."""
    from kvpool.index import PrefixIndex

    side_python("vllm-0.33")
    cases = index_cases(60, seed=43)
    answer = run_vllm("vllm-0.33", {"cache": cases}, tmp_path)
    parted = copies = 0
    for case, served in zip(cases, answer["cache"], strict=True):
        index = PrefixIndex(case["block_size"])
        held: set[int] = set()
        for events in served["events"]:
            index.apply("vllm", events)
            for e in events:
                if e["type"] == "BlockStored":
                    copies += len(held & set(e["block_hashes"]))
                    held |= set(e["block_hashes"])
                else:
                    held -= set(e["block_hashes"])
        assert not index.refused, case
        for query, hit in zip(case["queries"], served["hits"], strict=True):
            assert index.query(query["prompt"], query["salt"])["vllm"].gpu == hit, (case, query)
            without = PrefixIndex(case["block_size"])  # what a router that ignores the lookahead ids answers
            for events in served["events"]:
                without.apply("vllm", [{k: v for k, v in e.items() if k != "lookahead_token_ids"} for e in events])
            parted += without.query(query["prompt"], query["salt"])["vllm"].gpu != hit
    assert parted > 20, parted  # the queries that a router ignoring the lookahead ids answers wrongly
    assert copies > 5  # stores of a hash vLLM already held (13 in these cases)
