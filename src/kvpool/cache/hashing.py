"""Chained block hashes for prefix reuse.

The hash of page i covers the salt and every token of pages 0..i, so equal
hashes mean equal prefixes (up to 64-bit collisions). Python's tuple-of-int
hash is deterministic across processes (string hashing is not, so a string salt
is first digested with BLAKE2b), which keeps event hashes stable for a router.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

ROOT_HASH = 0x6B7670_6F6F6C  # seed of every chain without a salt ("kvpool")


def salt_seed(salt: str | bytes | int | None) -> int:
    """The chain's seed for a salt (a LoRA id, a tenant key, ...)."""
    if salt is None:
        return ROOT_HASH
    if isinstance(salt, int):
        return hash((ROOT_HASH, salt))
    data = salt.encode() if isinstance(salt, str) else bytes(salt)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def extend_hashes(hashes: list[int], tokens: Sequence[int], tokens_per_block: int,
                  seed: int, num_blocks: int) -> None:
    """Append hashes to `hashes` until it covers `num_blocks` whole pages of
    `tokens` (which must hold at least `num_blocks * tokens_per_block` ids)."""
    parent = hashes[-1] if hashes else seed
    for i in range(len(hashes), num_blocks):
        parent = hash((parent, tuple(tokens[i * tokens_per_block:(i + 1) * tokens_per_block])))
        hashes.append(parent)
