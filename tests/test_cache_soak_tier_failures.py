"""The soak run of the tiers with failing copies (`make soak`, not CI): many
random operations (create with a prompt, resize and commit, free, suspend,
resume) on managers with a host and a disk tier whose `TierCopies` fails a share
of its copies after scribbling on the destination. After every operation the
integrity check passes and every cached page and held slot holds what its
digest says; after a failed call, the requests, their pages and the pins are as
before it. Prints the counts.

KVPOOL_SOAK=1 runs it; KVPOOL_SOAK_TIER_OPS (default 200,000) and KVPOOL_SOAK_SEED
(default: the time) size and seed it."""

from __future__ import annotations

import os
import random
import time

import pytest

from cache_helpers import full_spec, hybrid_spec
from tier_helpers import TPB, DmaFailed, Flaky, assert_every_label_true, computed, requests_and_pins, tiered

pytestmark = pytest.mark.skipif(not os.environ.get("KVPOOL_SOAK"), reason="a soak run: make soak (KVPOOL_SOAK=1)")


def test_random_tier_operations_with_failing_copies_keep_the_books() -> None:
    n = int(os.environ.get("KVPOOL_SOAK_TIER_OPS", "200000"))
    seed = int(os.environ.get("KVPOOL_SOAK_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    counts = {"operations": 0, "copies": 0, "failed copies": 0, "calls undone": 0, "offloads lost": 0, "managers": 0}
    start = time.perf_counter()
    while counts["operations"] < n:
        hybrid = rng.random() < 0.5
        spec = hybrid_spec(tpb=TPB, window=8) if hybrid else full_spec(tpb=TPB)
        pages = {"full": 12, "sliding": 12, "linear_state": 4} if hybrid else {"full": 12}
        m = tiered(spec, pages, host_pages=rng.randint(1, 24), disk_pages=rng.randint(0, 12))
        labels = Flaky(rng.choice([0.02, 0.1, 0.3]), rng.randrange(2**32))
        m.set_tier_copies(labels)
        bank = [list(range(100, 100 + 4 * (i + 2))) + [i] for i in range(6)]
        counts["managers"] += 1
        for _ in range(500):
            op, rid, i = rng.choice("cccfsR"), rng.randrange(6), rng.randrange(6)
            kept = requests_and_pins(m)
            try:
                if op == "c" and rid not in m:
                    hit = m.create(rid, bank[i])
                    if m.resize(rid, len(bank[i]) + 1, len(bank[i])):
                        m.commit(rid, len(bank[i]))
                        computed(m, labels, rid, hit)
                elif op == "f" and rid in m:
                    m.free(rid)
                elif op == "s" and rid in m and m.suspension(rid) is None:
                    m.suspend(rid)
                elif op == "R" and rid in m and m.suspension(rid) is not None:
                    m.resume(rid)
            except DmaFailed:
                counts["calls undone"] += 1
                assert requests_and_pins(m) == kept, f"seed {seed}: a failed {op} changed the requests or pins"
            m.check_integrity()
            assert_every_label_true(m, labels)
            counts["operations"] += 1
        counts["copies"] += sum(labels.calls.values())
        counts["failed copies"] += labels.failed
        counts["offloads lost"] += m.stats().extra["failed_tier_copies"]
    print(
        f"\ntier soak (seed {seed}): "
        + ", ".join(f"{v:,} {k}" for k, v in counts.items())
        + f" in {time.perf_counter() - start:.0f} s; 0 violations"
    )
