"""vLLM's own block hashes, optional: `KVCacheManager(plan, hash="vllm:sha256_cbor")`
(or `"vllm:xxhash_cbor"`) digests pages as vLLM's prefix cache does, so a
consumer that compares engine hashes (LMCache sharing chunks between
prefill and decode instances, a router keyed on vLLM's hashes) can mix kvpool
and vLLM workers. kvpool's own digest (`cache/hashing.py`) stays the default:
it is several times faster and routers key on token ids anyway.

What vLLM does (vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py of
the 0.32.0 and 0.33.0 wheels; `hash_block_tokens`, `init_none_hash`,
`resolve_none_hash_seed`, `get_request_block_hasher`): block i's hash is
`H((parent, tuple(block i's token ids), extra_keys))`, where `H` is SHA-256
(or XXH3-128) of the canonical CBOR encoding of that tuple, `parent` the
previous block's hash (32 or 16 bytes) or, for block 0, `NONE_HASH =
H(seed)`; `seed` is `$PYTHONHASHSEED` when set, else the fixed string
"vllm-none-hash" for SHA-256 (XXH3 then gets random bytes: kvpool refuses
`xxhash_cbor` without `PYTHONHASHSEED`, which could never match). A request's
cache salt is block 0's extra key `(("cache_salt", salt),)`. Events carry the
low 64 bits, big-endian, as an unsigned int (`maybe_convert_block_hash`).
tests/test_kv_events_vllm.py checks all of it against vLLM's own hasher on
over 1,000 random (prompt, page size, salt) cases.

Inside the manager a page digest is the whole hash as an int (its bytes,
big-endian); the chain's seed for a salt is a negative int that this module
maps back to the salt's extra keys. No LoRA: vLLM's key for one names the
adapter's path, which kvpool does not know.
"""

from __future__ import annotations

import hashlib
import os
import struct
from array import array
from collections.abc import Callable
from typing import Any

from kvpool.cache.events import CacheUsageError
from kvpool.cache.hashing import Chain, ReuseScope, Salt, salt_seed

VLLM_HASHES = ("vllm:sha256_cbor", "vllm:xxhash_cbor")
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's, for the cryptographic algorithms


def cbor_head(major: int, n: int) -> bytes:
    """A CBOR item head in its shortest form (RFC 8949, 4.2.1: canonical)."""
    if n < 24:
        return bytes((major << 5 | n,))
    if n < 1 << 8:
        return bytes((major << 5 | 24, n))
    if n < 1 << 16:
        return bytes((major << 5 | 25,)) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes((major << 5 | 26,)) + n.to_bytes(4, "big")
    return bytes((major << 5 | 27,)) + n.to_bytes(8, "big")


def cbor(value: Any) -> bytes:
    """Canonical CBOR of None, ints, bytes, strings and tuples / lists of them
    (what `cbor2.dumps(value, canonical=True)` writes for these types)."""
    if value is None:
        return b"\xf6"
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return cbor_head(0, value) if value >= 0 else cbor_head(1, -1 - value)
    if isinstance(value, (bytes, bytearray)):
        return cbor_head(2, len(value)) + bytes(value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return cbor_head(3, len(data)) + data
    if isinstance(value, (tuple, list)):
        return cbor_head(4, len(value)) + b"".join(map(cbor, value))
    raise TypeError(f"no CBOR encoding here for {type(value).__name__}")


# one token id's CBOR (a uint): ids below 24 are one byte, and so on; packed per width class
_U8, _U16, _U32 = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I")


def cbor_ids(ids: array[int]) -> bytes:
    """Canonical CBOR of `tuple(ids)` (non-negative token ids)."""
    out = [cbor_head(4, len(ids))]
    for t in ids:
        if t < 24:
            out.append(bytes((t,)))
        elif t < 1 << 8:
            out.append(b"\x18" + _U8.pack(t))
        elif t < 1 << 16:
            out.append(b"\x19" + _U16.pack(t))
        elif t < 1 << 32:
            out.append(b"\x1a" + _U32.pack(t))
        else:
            out.append(b"\x1b" + t.to_bytes(8, "big"))
    return b"".join(out)


class VllmHasher:
    """vLLM's block hasher for `algorithm` ("sha256_cbor" or "xxhash_cbor"):
    `seed(salt)` starts a chain, `chain` digests pages (a `hashing.Chain`)."""

    def __init__(self, algorithm: str) -> None:
        env = os.environ.get("PYTHONHASHSEED")
        if algorithm == "sha256_cbor":
            self.digest: Callable[[bytes], bytes] = lambda data: hashlib.sha256(data).digest()
            self.size = 32
        elif algorithm == "xxhash_cbor":
            if env is None:
                raise CacheUsageError(
                    "hash='vllm:xxhash_cbor' needs PYTHONHASHSEED set (as vLLM does: without it vLLM seeds "
                    "xxhash_cbor at random and no other process can match its hashes)"
                )
            try:
                from xxhash import xxh3_128_digest
            except ImportError as exc:
                raise CacheUsageError(
                    f"hash='vllm:xxhash_cbor' needs the xxhash package (kvpool[fast]): {exc}"
                ) from None
            self.digest = xxh3_128_digest
            self.size = 16
        else:
            raise CacheUsageError(f"unknown vLLM hash {algorithm!r} (sha256_cbor, xxhash_cbor)")
        self.algorithm = algorithm
        self.none_hash = self.digest(cbor(DEFAULT_NONE_HASH_SEED if env is None else env))
        self.roots: dict[int, tuple[Any, ...] | None] = {-1: None}  # chain seed -> block 0's extra keys

    def seed(self, salt: Salt) -> int:
        """The chain seed for a cache salt (a str, None or a `ReuseScope`
        without a LoRA name): a negative int naming block 0's extra keys."""
        if isinstance(salt, ReuseScope):
            if salt.lora is not None:
                raise CacheUsageError(f"hash='vllm:{self.algorithm}' hashes no LoRA name (vLLM's key names its path)")
            salt = salt.salt
        if salt is not None and not isinstance(salt, str):
            raise CacheUsageError(f"hash='vllm:{self.algorithm}' takes a str cache salt (as vLLM), not {salt!r}")
        if not salt:  # vLLM adds no key for an empty salt
            return -1
        key = -2 - int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "big")
        self.roots[key] = (("cache_salt", salt),)
        return key

    def chain(self, parent: int, data: bytes, width: int, ahead: int = 0) -> list[int]:
        """vLLM's hashes of the pages in `data` (int64 little-endian ids,
        `width` bytes a page) after `parent` (a hash, or a seed). With `ahead`
        (vLLM 0.33's `num_hash_lookahead_tokens`), `data` ends with that many
        more ids and each page's extra keys become `(keys, *the ids after it)`
        (`get_request_block_hasher`)."""
        ids = array("q")
        ids.frombytes(data)
        per_page = width // 8
        out: list[int] = []
        for first in range(0, len(ids) - ahead, per_page):
            if parent < 0:
                head, extra = self.none_hash, self.roots[parent]
            else:
                head, extra = parent.to_bytes(self.size, "big"), None
            if ahead:
                extra = (extra, *ids[first + per_page : first + per_page + ahead])
            encoded = b"\x83" + cbor(head) + cbor_ids(ids[first : first + per_page]) + cbor(extra)
            parent = int.from_bytes(self.digest(encoded), "big")
            out.append(parent)
        return out


def block_hasher(name: str) -> tuple[Callable[[Salt], int], Chain | None]:
    """(seed of a salt, page chain) for `hash=name`: "kvpool" (kvpool's own
    digest: `salt_seed`, the default chain) or one of `VLLM_HASHES`."""
    if name == "kvpool":
        return salt_seed, None
    if name not in VLLM_HASHES:
        raise CacheUsageError(f"hash must be 'kvpool' or one of {list(VLLM_HASHES)}, not {name!r}")
    hasher = VllmHasher(name.split(":", 1)[1])
    return hasher.seed, hasher.chain
