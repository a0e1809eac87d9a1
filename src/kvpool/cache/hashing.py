"""Chained page digests for prefix reuse.

The digest of page i covers the salt and every token of pages 0..i, so equal
digests mean equal prefixes (up to 64-bit collisions of a real hash): page i's
digest is a hash of the previous page's 8-byte digest followed by page i's
token ids as little-endian int64 bytes, and the chain starts from the salt's
own digest (`salt_seed`). Every input is fixed-width bytes, so two different
(salt, prefix) pairs never feed the hash the same bytes: unlike Python's
`hash()` of a tuple of ints (where n and n + 2**61 - 1 hash alike), nothing
collides by construction.

The hash is XXH3-64 from the optional `xxhash` package (the extra
`kvpool[fast]`) when it is installed, else BLAKE2b-64 from `hashlib` (about
3x slower); both are deterministic across processes and machines, which keeps
event hashes stable for a KV-aware router (a router must see every engine
use the same one: `DIGEST` names it). Digests are signed 64-bit ints, the type
vLLM's KV events carry.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

from kvpool.cache.events import CacheUsageError

ROOT_HASH = 0x6B7670_6F6F6C  # seed of every chain without a salt ("kvpool")


def blake2b_digest(data: bytes) -> bytes:
    """BLAKE2b with an 8-byte digest: the fallback page digest."""
    return hashlib.blake2b(data, digest_size=8, person=b"kvpool-page").digest()


def digest_function(name: str) -> Callable[[bytes], bytes]:
    """The 8-byte page digest called `name` ("xxh3" or "blake2b"); raises
    ImportError for "xxh3" without the `xxhash` package."""
    if name == "blake2b":
        return blake2b_digest
    if name == "xxh3":
        import xxhash  # optional extra kvpool[fast]

        return xxhash.xxh3_64_digest  # type: ignore[no-any-return]
    raise ValueError(f"unknown page digest {name!r}")


try:
    page_digest = digest_function("xxh3")
    DIGEST = "xxh3"
except ImportError:
    page_digest = blake2b_digest
    DIGEST = "blake2b"


def salt_seed(salt: str | bytes | int | None) -> int:
    """The chain's seed for a salt (a LoRA id, a tenant key, ...).

    The seed is a BLAKE2b digest of the salt's exact bytes behind a type tag,
    so distinct salts get distinct reuse scopes (up to 64-bit collisions):
    `1`, `"1"` and `b"1"` differ, and so do integers that Python's `hash()`
    maps alike (-1 and -2, or n and n + 2**61 - 1). Raises `CacheUsageError`
    for any other type of salt."""
    if salt is None:
        return ROOT_HASH
    return int.from_bytes(
        hashlib.blake2b(_salt_bytes(salt), digest_size=8, person=b"kvpool-salt").digest(), "little", signed=True
    )


def _salt_bytes(salt: object) -> bytes:
    """Type tag + exact bytes of a salt."""
    if isinstance(salt, bool):
        return b"o" + (b"1" if salt else b"0")
    if isinstance(salt, int):
        length = (salt.bit_length() + 8) // 8  # room for the sign bit
        return b"i" + salt.to_bytes(length, "little", signed=True)
    if isinstance(salt, str):
        return b"s" + salt.encode("utf-8", "surrogatepass")
    if isinstance(salt, (bytes, bytearray, memoryview)):
        return b"b" + bytes(salt)
    raise CacheUsageError(f"salt must be str, bytes, int or None, not {type(salt).__name__}")


def extend_hashes(
    hashes: list[int],
    tokens: Sequence[int] | array[int],
    tokens_per_block: int,
    seed: int,
    num_blocks: int,
    digest: Callable[[bytes], bytes] | None = None,
) -> None:
    """Append page digests to `hashes` until it covers `num_blocks` whole pages
    of `tokens` (int64 token ids; at least `num_blocks * tokens_per_block` of
    them). `digest` defaults to `page_digest`."""
    first = len(hashes)
    if first >= num_blocks:
        return
    h = page_digest if digest is None else digest
    ids = tokens if type(tokens) is array else array("q", tokens)
    data = ids[first * tokens_per_block : num_blocks * tokens_per_block].tobytes()  # only the new pages
    width = 8 * tokens_per_block
    parent = (hashes[-1] if hashes else seed).to_bytes(8, "little", signed=True)
    from_bytes, append = int.from_bytes, hashes.append
    for off in range(0, len(data), width):
        parent = h(parent + data[off : off + width])
        append(from_bytes(parent, "little", signed=True))
