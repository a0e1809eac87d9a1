"""Chained page digests for prefix reuse.

The digest of page i covers the salt and every token of pages 0..i, so equal
digests mean equal prefixes (up to 64-bit collisions of a real hash): page i's
digest is a hash of page i's token ids as little-endian int64 bytes keyed by
the previous page's digest, and the chain starts from the salt's own digest
(`salt_seed`). With XXH3-64 (the optional `xxhash` package, extra
`kvpool[fast]`) the parent digest is the hash's 64-bit seed, so a page costs
one call on a slice of the prompt's bytes; the BLAKE2b-64 fallback (`hashlib`,
about 3x slower) hashes the parent's 8 bytes followed by the page's. Every
input is fixed-width, so two different (salt, prefix) pairs never feed the hash
the same input: unlike Python's `hash()` of a tuple of ints (where n and
n + 2**61 - 1 hash alike), nothing collides by construction. Both are
deterministic across processes and machines, which keeps event hashes stable
for a KV-aware router (a router must see every engine use the same one:
`DIGEST` names it). Digests are unsigned 64-bit ints inside the manager (no
sign fix-up per page); `CacheEvent`s carry them as signed 64-bit ints, the type
vLLM's KV events carry (`events.as_signed`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TypeAlias

import numpy as np

from kvpool.cache.events import CacheUsageError

ROOT_HASH = 0x6B7670_6F6F6C  # seed of every chain without a salt ("kvpool")
MASK64 = (1 << 64) - 1

# (parent digest, bytes of whole pages, page width in bytes) -> the pages' unsigned digests, chained
Chain = Callable[[int, bytes, int], list[int]]
# (one page's bytes, parent digest as an unsigned 64-bit int) -> that page's unsigned digest: a chain of
# one page, one call (XXH3's own function, no Python frame: a decode step's page is digested here)
Digest = Callable[[bytes | memoryview, int], int]


def blake2b_chain(parent: int, data: bytes, width: int) -> list[int]:
    """Page digests by BLAKE2b-64 of (parent's 8 bytes, little-endian, as an
    unsigned 64-bit int) followed by the page's bytes: the fallback."""
    out: list[int] = []
    parent &= MASK64
    for off in range(0, len(data), width):
        parent = blake2b_digest(data[off : off + width], parent)
        out.append(parent)
    return out


def blake2b_digest(page: bytes | memoryview, parent: int) -> int:
    """`blake2b_chain` of one page (`parent` unsigned)."""
    prev = parent.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(prev + page, digest_size=8, person=b"kvpool-page").digest(), "little")


def digest_function(name: str) -> Digest:
    """The one-page digest of the chain called `name` (`chain_function`)."""
    if name == "blake2b":
        return blake2b_digest
    if name == "xxh3":
        from xxhash import xxh3_64_intdigest

        return xxh3_64_intdigest  # (data, seed): `xxh3_chain` of one page
    raise ValueError(f"unknown page digest {name!r}")


@cache
def page_type(width: int) -> np.dtype[np.void]:
    """NumPy's type of one page of `width` bytes (a new dtype costs microseconds: made once per width)."""
    return np.dtype((np.void, width))


def chain_function(name: str) -> Chain:
    """The page chain called `name` ("xxh3" or "blake2b"); raises ImportError
    for "xxh3" without the `xxhash` package."""
    if name == "blake2b":
        return blake2b_chain
    if name == "xxh3":
        from xxhash import xxh3_64_intdigest  # optional extra kvpool[fast]

        def xxh3_chain(parent: int, data: bytes, width: int) -> list[int]:
            """Page digests by XXH3-64 of the page's bytes, seeded with the parent digest (mod 2**64)."""
            out: list[int] = []
            seed, append = parent & MASK64, out.append
            # NumPy splits the pages' bytes in one call: a quarter less CPU a page than slicing each in the loop
            for page in np.frombuffer(data, page_type(width)).tolist():
                seed = xxh3_64_intdigest(page, seed)
                append(seed)
            return out

        return xxh3_chain
    raise ValueError(f"unknown page digest {name!r}")


try:
    page_chain, page_digest = chain_function("xxh3"), digest_function("xxh3")
    DIGEST = "xxh3"
except ImportError:
    page_chain, page_digest = blake2b_chain, blake2b_digest
    DIGEST = "blake2b"


@dataclass(frozen=True)
class ReuseScope:
    """A reuse scope with the names routers key on: `salt` (a tenant's cache
    salt; events publish it in block 0's `extra_keys`, as vLLM does its
    `cache_salt`) and `lora` (a LoRA adapter's name; events publish it as
    `lora_name` and first in every block's `extra_keys`). Pass it as `salt`.
    Without a LoRA name it is the plain salt: the same scope as `salt` itself."""

    salt: str | None = None
    lora: str | None = None

    def __post_init__(self) -> None:
        for name in ("salt", "lora"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise CacheUsageError(f"ReuseScope.{name} must be a str or None, not {type(value).__name__}")


Salt: TypeAlias = str | bytes | int | ReuseScope | None


def salt_seed(salt: Salt) -> int:
    """The chain's seed for a salt (a LoRA id, a tenant key, ...).

    The seed is a BLAKE2b digest of the salt's exact bytes behind a type tag,
    so distinct salts get distinct reuse scopes (up to 64-bit collisions):
    `1`, `"1"` and `b"1"` differ, and so do integers that Python's `hash()`
    maps alike (-1 and -2, or n and n + 2**61 - 1). Raises `CacheUsageError`
    for any other type of salt."""
    plain = salt.salt if isinstance(salt, ReuseScope) and salt.lora is None else salt
    if plain is None:
        return ROOT_HASH
    return int.from_bytes(
        hashlib.blake2b(_salt_bytes(plain), digest_size=8, person=b"kvpool-salt").digest(), "little", signed=True
    )


def published_scope(salt: object) -> tuple[str | None, str | None]:
    """(cache salt, LoRA name) as events publish a salt: a str salt as it is
    (what vLLM's `cache_salt` is; a router given the same string finds it),
    an int or bytes salt as `"int:<n>"` / `"bytes:<hex>"`."""
    if isinstance(salt, ReuseScope):
        return salt.salt, salt.lora
    if salt is None or isinstance(salt, str):
        return salt, None
    if isinstance(salt, (bytes, bytearray, memoryview)):
        return "bytes:" + bytes(salt).hex(), None
    return f"{type(salt).__name__}:{salt}", None


def _salt_bytes(salt: object) -> bytes:
    """Type tag + exact bytes of a salt."""
    if isinstance(salt, ReuseScope):  # with a LoRA name (a scope without one is its plain salt)
        assert salt.lora is not None
        lora = salt.lora.encode("utf-8", "surrogatepass")
        return b"r" + len(lora).to_bytes(8, "little") + lora + _salt_bytes(salt.salt)
    if salt is None:
        return b"n"
    if isinstance(salt, bool):
        return b"o" + (b"1" if salt else b"0")
    if isinstance(salt, int):
        length = (salt.bit_length() + 8) // 8  # room for the sign bit
        return b"i" + salt.to_bytes(length, "little", signed=True)
    if isinstance(salt, str):
        return b"s" + salt.encode("utf-8", "surrogatepass")
    if isinstance(salt, (bytes, bytearray, memoryview)):
        return b"b" + bytes(salt)
    raise CacheUsageError(f"salt must be str, bytes, int, ReuseScope or None, not {type(salt).__name__}")


def extend_hashes(
    hashes: list[int],
    tokens: Sequence[int] | array[int],
    tokens_per_block: int,
    seed: int,
    num_blocks: int,
    chain: Chain | None = None,
    base: int = 0,
) -> None:
    """Append page digests to `hashes` until it covers `num_blocks` whole pages
    of `tokens` (int64 token ids of positions `base`..., up to at least
    `num_blocks * tokens_per_block`; `base` at most the first new page's start).
    `chain` defaults to `page_chain`; a `LookaheadChain` digests only the pages
    whose `ahead` following ids are known, so `hashes` may stop short."""
    first = len(hashes)
    if first >= num_blocks:
        return
    ids = tokens if type(tokens) is array else array("q", tokens)
    ahead = 0 if chain is None else getattr(chain, "ahead", 0)
    if ahead:  # a page is digested once the `ahead` ids after it are known
        num_blocks = min(num_blocks, (base + len(ids) - ahead) // tokens_per_block)
        if first < num_blocks:
            data = ids[first * tokens_per_block - base : num_blocks * tokens_per_block + ahead - base].tobytes()
            hashes += chain(hashes[-1] if hashes else seed, data, 8 * tokens_per_block)  # type: ignore[misc]
        return
    if first + 1 == num_blocks and chain is None:  # one page (a decode step's): one digest call
        page = ids[first * tokens_per_block - base : num_blocks * tokens_per_block - base].tobytes()
        hashes.append(page_digest(page, hashes[-1] if hashes else seed & MASK64))
        return
    with memoryview(ids) as view:  # only the new pages' bytes, copied once (a slice of `ids` would copy them twice)
        data = view[first * tokens_per_block - base : num_blocks * tokens_per_block - base].tobytes()
    hashes += (page_chain if chain is None else chain)(hashes[-1] if hashes else seed, data, 8 * tokens_per_block)


class LookaheadChain:
    """A chain whose page digests also cover the `ahead` token ids after each
    page: vLLM 0.33's lookahead block hashes (`num_hash_lookahead_tokens`, on
    when an EAGLE-family drafter runs with prefix caching), since the drafter's
    KV at a page's last position depends on the token after it. Called with the
    pages' bytes followed by `ahead` more ids; `base` is vLLM's chain (its own
    lookahead keys, `VllmHasher.chain`) or None for kvpool's digest of a page's
    bytes followed by its lookahead's."""

    def __init__(self, base: Callable[..., list[int]] | None, ahead: int) -> None:
        if type(ahead) is not int or ahead < 1:
            raise CacheUsageError(f"hash_lookahead must be a positive int, got {ahead!r}")
        self.base, self.ahead = base, ahead

    def __call__(self, parent: int, data: bytes, width: int) -> list[int]:
        if self.base is not None:
            return self.base(parent, data, width, self.ahead)
        tail = 8 * self.ahead
        out: list[int] = []
        parent &= MASK64
        for off in range(0, len(data) - tail, width):
            parent = page_digest(data[off : off + width + tail], parent)
            out.append(parent)
        return out
