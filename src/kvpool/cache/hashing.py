"""Chained block hashes for prefix reuse.

The hash of page i covers the salt and every token of pages 0..i, so equal
hashes mean equal prefixes (up to 64-bit collisions). Python's tuple-of-int
hash is deterministic across processes (string hashing is not, so every salt
is first digested with BLAKE2b, type-tagged: `salt_seed`), which keeps event
hashes stable for a router.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kvpool.cache.events import CacheUsageError

ROOT_HASH = 0x6B7670_6F6F6C  # seed of every chain without a salt ("kvpool")


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


def extend_hashes(hashes: list[int], tokens: Sequence[int], tokens_per_block: int, seed: int, num_blocks: int) -> None:
    """Append hashes to `hashes` until it covers `num_blocks` whole pages of
    `tokens` (which must hold at least `num_blocks * tokens_per_block` ids)."""
    parent = hashes[-1] if hashes else seed
    for i in range(len(hashes), num_blocks):
        parent = hash((parent, tuple(tokens[i * tokens_per_block : (i + 1) * tokens_per_block])))
        hashes.append(parent)
