"""Referee: vLLM's own KV-event classes and block hasher, run in vLLM's side
venv (not kvpool's; tests/test_kv_events_vllm.py starts it).

Reads one JSON object on stdin and writes one on stdout:

- `decode`: [{"wire": "map" | "array", "payloads": [hex, ...]}]: every
  payload decoded with `vllm.distributed.kv_events.KVEventBatch`'s msgspec
  decoder (`wire="map"`: vLLM's classes as they are; `"array"`: the same
  classes with `array_like=True`, vLLM's encoding before PR #42892), each
  event written back as {"type": tag, field: value, ...}, or the decoder's
  error message;
- `hash`: [{"algorithm", "block_size", "prompt", "salt", "seed"}]: the block
  hashes vLLM's request block hasher (`get_request_block_hasher` after
  `init_none_hash`, PYTHONHASHSEED set to `seed` when given) gives a
  `vllm.v1.request.Request` with that prompt and `cache_salt`, as hex bytes
  (with `"lookahead": L`, vLLM 0.33's hasher of `num_hash_lookahead_tokens=L`);
- `cache`: [{"block_size", "lookahead", "num_blocks", "requests": [{"prompt",
  "salt", "decode": [ids], "stay": n}], "queries": [{"prompt", "salt"}]}]:
  vLLM 0.33's own `KVCacheManager` (one full-attention group, prefix caching,
  KV events, `num_hash_lookahead_tokens=L`, sha256_cbor) serves the requests
  in order (each prefilled, then decoded one id at a time, freed `stay`
  requests later, as the scheduler would drive it), and answers the events it
  emitted (`take_events`, per request, as {"type": tag, field: value}) and,
  per query, the tokens its prefix cache holds for that prompt at the end
  (`find_longest_cache_hit` of the query's own block hashes, whole prompt).

Only the inputs are ours; every decoded value and every hash is vLLM's.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import msgspec
from vllm.distributed import kv_events as ke
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.request import Request

logging.disable(logging.WARNING)


class ArrayBlockStored(ke.BlockStored, array_like=True, tag="BlockStored"):
    pass


class ArrayBlockRemoved(ke.BlockRemoved, array_like=True, tag="BlockRemoved"):
    pass


class ArrayAllBlocksCleared(ke.AllBlocksCleared, array_like=True, tag="AllBlocksCleared"):
    pass


class ArrayKVEventBatch(ke.EventBatch):
    events: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared]


DECODERS = {"map": msgspec.msgpack.Decoder(ke.KVEventBatch), "array": msgspec.msgpack.Decoder(ArrayKVEventBatch)}
TAGS = {
    ke.BlockStored: "BlockStored",
    ke.BlockRemoved: "BlockRemoved",
    ke.AllBlocksCleared: "AllBlocksCleared",
}


def event_fields(event: Any) -> dict[str, Any]:
    tag = next(t for cls, t in TAGS.items() if isinstance(event, cls))
    return {"type": tag, **msgspec.to_builtins(msgspec.structs.asdict(event))}


def decode(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for job in jobs:
        decoder = DECODERS[job["wire"]]
        batches: list[Any] = []
        for payload in job["payloads"]:
            try:
                batch = decoder.decode(bytes.fromhex(payload))
            except msgspec.DecodeError as exc:
                batches.append({"error": str(exc)})
                continue
            batches.append(
                {"ts": batch.ts, "rank": batch.data_parallel_rank, "events": [event_fields(e) for e in batch.events]}
            )
        out.append(batches)
    return out


def hashes(cases: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for case in cases:
        if case.get("seed") is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = case["seed"]
        fn = get_hash_fn_by_name(case["algorithm"])
        ku.init_none_hash(fn)
        request = Request(
            request_id="r",
            prompt_token_ids=case["prompt"],
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            cache_salt=case["salt"],
            block_hasher=(
                ku.get_request_block_hasher(case["block_size"], fn, case["lookahead"])
                if case.get("lookahead")  # vLLM 0.33's num_hash_lookahead_tokens
                else ku.get_request_block_hasher(case["block_size"], fn)
            ),
        )
        out.append([bytes(h).hex() for h in request.block_hashes])
    return out


def serve(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    bs, ahead = case["block_size"], case["lookahead"]
    fn = get_hash_fn_by_name("sha256_cbor")
    ku.init_none_hash(fn)
    hasher = ku.get_request_block_hasher(bs, fn, ahead)
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float16)
    config = KVCacheConfig(case["num_blocks"], [], [KVCacheGroupSpec(["layer.0"], spec)])
    manager = KVCacheManager(
        config,
        max_model_len=4096,
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=True,
        enable_kv_cache_events=True,
        num_hash_lookahead_tokens=ahead,
    )

    def request(name: str, item: dict[str, Any]) -> Request:
        params = SamplingParams(max_tokens=1 + len(item.get("decode", [])))
        return Request(name, item["prompt"], params, None, cache_salt=item["salt"], block_hasher=hasher)

    batches: list[list[dict[str, Any]]] = []
    live: list[tuple[int, Request]] = []
    for i, item in enumerate(case["requests"]):
        req = request(f"r{i}", item)
        blocks, hit, _ = manager.get_computed_blocks(req)
        if manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None:
            req.num_computed_tokens = req.num_tokens
            for token in item.get("decode", []):  # one step each: the sampled id, then its KV
                req.append_output_token_ids(token)
                if manager.allocate_slots(req, 1) is None:
                    break
                req.num_computed_tokens += 1
            live.append((i + item["stay"], req))
        for end, done in [x for x in live if x[0] <= i]:
            manager.free(done)
            live.remove((end, done))
        batches.append([event_fields(e) for e in manager.take_events()])
    hits = []
    for j, item in enumerate(case["queries"]):
        req = request(f"q{j}", item)
        hits.append(manager.coordinator.find_longest_cache_hit(req.block_hashes, req.num_tokens)[1])
    return {"events": batches, "hits": hits}


def main() -> None:
    job = json.load(sys.stdin)
    json.dump(
        {
            "decode": decode(job.get("decode", [])),
            "hash": hashes(job.get("hash", [])),
            "cache": [serve(case) for case in job.get("cache", [])],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
