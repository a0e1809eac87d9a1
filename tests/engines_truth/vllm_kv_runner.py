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
  (with `"lookahead": L`, vLLM 0.33's hasher of `num_hash_lookahead_tokens=L`).

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


def main() -> None:
    job = json.load(sys.stdin)
    json.dump({"decode": decode(job.get("decode", [])), "hash": hashes(job.get("hash", []))}, sys.stdout)


if __name__ == "__main__":
    main()
