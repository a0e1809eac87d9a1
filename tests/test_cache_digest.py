"""Page digests (cache/hashing.py): a real hash of the int64 bytes of each page's
tokens, keyed by the parent digest from the salt's digest; XXH3-64 with the
`xxhash` extra, BLAKE2b-64 without; the same in every process."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_helpers import full_spec, manager
from kvpool.cache import hashing
from kvpool.cache.hashing import ROOT_HASH, chain_function, digest_function, extend_hashes, salt_seed

TPB = 4
TOKENS = [7, 8, 9, 10, 11, 12, 13, 14, 15]  # two whole pages of 4 (and one token over)
DIGESTS = ["blake2b", "xxh3"]


def chain_by_hand(name: str, seed: int, tokens: list[int], pages: int, tpb: int = TPB) -> list[int]:
    """The documented format, spelled out with struct and the digest's own
    library: each page's tokens as '<q' each, keyed by the parent digest as an
    unsigned 64-bit int (XXH3's seed; BLAKE2b's input prefixed by its 8 bytes,
    little-endian); every digest an unsigned 64-bit int."""
    out, parent = [], seed % 2**64
    for i in range(pages):
        page = struct.pack(f"<{tpb}q", *tokens[i * tpb : (i + 1) * tpb])
        if name == "xxh3":
            xxhash = pytest.importorskip("xxhash")
            parent = xxhash.xxh3_64_intdigest(page, seed=parent)
        else:
            digest = hashlib.blake2b(struct.pack("<Q", parent) + page, digest_size=8, person=b"kvpool-page").digest()
            parent = struct.unpack("<Q", digest)[0]
        out.append(parent)
    return out


def signed(digests: list[int]) -> list[int]:
    """Unsigned 64-bit digests read as signed int64, as events carry them."""
    return [struct.unpack("<q", struct.pack("<Q", d))[0] for d in digests]


@pytest.mark.parametrize("name", DIGESTS)
@pytest.mark.parametrize("salt", [None, "tenant-a", -1, b"\x00"])
def test_digest_is_the_documented_chain(name: str, salt: str | bytes | int | None) -> None:
    got: list[int] = []
    extend_hashes(got, TOKENS, TPB, salt_seed(salt), 2, chain_function(name))
    assert got == chain_by_hand(name, salt_seed(salt), TOKENS, 2)
    # extending page by page gives the same chain as in one go
    step: list[int] = []
    extend_hashes(step, TOKENS, TPB, salt_seed(salt), 1, chain_function(name))
    extend_hashes(step, TOKENS, TPB, salt_seed(salt), 2, chain_function(name))
    assert step == got
    assert all(0 <= x < 2**64 for x in got)  # unsigned inside the manager


@pytest.mark.parametrize("name", DIGESTS)
@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=120),
    tpb=st.integers(1, 9),
    parent=st.integers(0, 2**64 - 1),
    first=st.integers(0, 5),
)
def test_long_chains_are_the_documented_chain(name: str, tokens: list[int], tpb: int, parent: int, first: int) -> None:
    """Many pages at once, and a chain picked up after `first` pages, give
    the page-by-page chain (the chain is one C-level pass over all pages)."""
    if name == "xxh3":
        pytest.importorskip("xxhash")
    pages = len(tokens) // tpb
    want = chain_by_hand(name, parent, tokens, pages, tpb)
    got = want[:first] if first <= pages else []
    extend_hashes(got, tokens, tpb, parent, pages, chain_function(name))
    assert got == want


@pytest.mark.parametrize("name", DIGESTS)
@pytest.mark.parametrize(("a", "b"), [(-1, -2), (5, 5 + 2**61 - 1), (1, "1"), ("1", b"1"), (1, b"1"), (None, 0)])
def test_salts_stay_isolated_in_every_page(name: str, a: object, b: object) -> None:
    if name == "xxh3":
        pytest.importorskip("xxhash")
    chains = []
    for salt in (a, b):
        out: list[int] = []
        extend_hashes(out, TOKENS, TPB, salt_seed(salt), 2, chain_function(name))  # type: ignore[arg-type]
        chains.append(out)
    assert chains[0][0] != chains[1][0] and chains[0][1] != chains[1][1]


@pytest.mark.parametrize("name", DIGESTS)
def test_tokens_python_hash_confuses_are_told_apart(name: str) -> None:
    if name == "xxh3":
        pytest.importorskip("xxhash")
    other = [TOKENS[0] + 2**61 - 1, *TOKENS[1:]]  # still an int64 token id
    assert hash((ROOT_HASH, tuple(TOKENS[:TPB]))) == hash((ROOT_HASH, tuple(other[:TPB])))  # the old scheme
    ours: list[int] = []
    theirs: list[int] = []
    extend_hashes(ours, TOKENS, TPB, ROOT_HASH, 1, chain_function(name))
    extend_hashes(theirs, other, TPB, ROOT_HASH, 1, chain_function(name))
    assert ours != theirs


def test_prompts_python_hash_confuses_share_no_page() -> None:
    m = manager(full_spec(tpb=16), {"full": 20})
    prompt = list(range(100, 150))
    twin = [prompt[0] + 2**61 - 1, *prompt[1:]]
    m.create(1, prompt)
    assert m.resize(1, len(prompt) + 1, len(prompt))
    m.commit(1, len(prompt))
    assert m.create(2, twin) == 0
    assert m.create(3, prompt) == 48
    m.check_integrity()


@pytest.mark.parametrize("name", DIGESTS)
@pytest.mark.parametrize("parent", [ROOT_HASH, 0, 2**64 - 1, -1, 2**70 + 3])
def test_one_page_digest_is_the_chain_of_one_page(name: str, parent: int) -> None:
    if name == "xxh3":
        pytest.importorskip("xxhash")
    page = struct.pack(f"<{TPB}q", *TOKENS[:TPB])
    one = digest_function(name)(page, parent & (2**64 - 1))  # the one-page digest takes the parent unsigned
    assert one == chain_function(name)(parent, page, len(page))[0]
    assert one == chain_by_hand(name, parent, TOKENS, 1)[0]


def test_unknown_digest_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown page digest"):
        chain_function("md5")
    with pytest.raises(ValueError, match="unknown page digest"):
        digest_function("md5")


def run_python(code: str, **env: str) -> str:
    path = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": path, **env},
        timeout=120,
    )
    return out.stdout.strip()


CHAIN_CODE = (
    "from kvpool.cache.hashing import DIGEST, extend_hashes, salt_seed\n"
    "out = []\n"
    "extend_hashes(out, list(range(40)), 4, salt_seed('tenant-a'), 10)\n"
    "print(DIGEST, out)\n"
)


def test_digests_are_stable_across_processes() -> None:
    here: list[int] = []
    extend_hashes(here, list(range(40)), 4, salt_seed("tenant-a"), 10)
    expected = f"{hashing.DIGEST} {here}"
    # string hashing is randomised per process: the digests must not depend on it
    assert run_python(CHAIN_CODE, PYTHONHASHSEED="1") == expected
    assert run_python(CHAIN_CODE, PYTHONHASHSEED="2") == expected


def test_without_xxhash_the_blake2b_fallback_is_used() -> None:
    blocked = "import sys\nsys.modules['xxhash'] = None  # import xxhash now raises ImportError\n"
    got = run_python(blocked + CHAIN_CODE)
    fallback: list[int] = []
    extend_hashes(fallback, list(range(40)), 4, salt_seed("tenant-a"), 10, chain_function("blake2b"))
    assert got == f"blake2b {fallback}"


@pytest.mark.parametrize("name", DIGESTS)
def test_manager_reuses_under_either_digest(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "xxh3":
        pytest.importorskip("xxhash")
    monkeypatch.setattr(hashing, "page_chain", chain_function(name))
    monkeypatch.setattr(hashing, "page_digest", digest_function(name))
    m = manager(full_spec(tpb=16), {"full": 20})
    prompt = list(range(1000, 1100))
    m.create(1, prompt, salt="a")
    assert m.resize(1, 101, 100)
    m.commit(1, 100)  # 100 // 16 = 6 whole pages stored
    events = m.take_events()
    want = signed(chain_by_hand(name, salt_seed("a"), prompt, 6, 16))  # the int64 vLLM's events carry
    assert [e.block_hash for e in events] == want
    assert [e.parent_hash for e in events] == [None, *want[:-1]]
    assert m.create(2, prompt, salt="a") == 96
    assert m.create(3, prompt, salt="b") == 0
    m.check_integrity()


@pytest.mark.parametrize("name", DIGESTS)
def test_decode_commits_chain_under_either_digest(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One token per step, as a decode loop commits: the page each step
    completes (the one-page commit) carries the documented chain's digest."""
    if name == "xxh3":
        pytest.importorskip("xxhash")
    monkeypatch.setattr(hashing, "page_chain", chain_function(name))
    monkeypatch.setattr(hashing, "page_digest", digest_function(name))
    m = manager(full_spec(tpb=16), {"full": 20})
    prompt, generated = list(range(1000, 1020)), list(range(50, 110))
    m.create(1, prompt, salt="a")
    assert m.resize(1, 21, 20)
    m.commit(1, 20)  # the prompt's one whole page
    for i, token in enumerate(generated):  # position 20 + i is computed, and its token told
        history = 21 + i
        assert m.resize(1, history + 1, history)
        m.commit(1, history, (token,))
    every = prompt + generated
    pages = len(every) // 16  # 5: one at the prompt's commit, four at decode steps
    want = signed(chain_by_hand(name, salt_seed("a"), every, pages, 16))
    assert [e.block_hash for e in m.take_events()] == want
    assert m.create(2, [*every, 0], salt="a") == pages * 16  # one token past the pages, to compute
    m.check_integrity()
