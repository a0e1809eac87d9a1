"""The soak run of the generated CLI bad-input suite (`make soak`, not CI): many
random mutations of the generated bad values (tests/cli_bad_cases.py), each
must answer exit 0 (a mutation may be valid) or exit 2 with one stderr line, never
an internal error or a traceback, within 30 s, leaving no file behind. Prints
the resident memory before and after, so growth over the run shows.

KVPOOL_SOAK=1 runs it; KVPOOL_SOAK_CASES (default 20,000) and KVPOOL_SOAK_SEED
(default: the time) size and seed it."""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cli_bad_cases import lay_out_files, random_cases

pytestmark = pytest.mark.skipif(not os.environ.get("KVPOOL_SOAK"), reason="a soak run: make soak (KVPOOL_SOAK=1)")


def _expire(*_: Any) -> None:
    raise TimeoutError("a case ran for 30 s")


def test_random_bad_flag_values_never_crash(cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = int(os.environ.get("KVPOOL_SOAK_CASES", "20000"))
    seed = int(os.environ.get("KVPOOL_SOAK_SEED", str(int(time.time()))))
    monkeypatch.chdir(tmp_path)
    lay_out_files(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    old = signal.signal(signal.SIGALRM, _expire)
    failures: list[str] = []
    codes = {0: 0, 2: 0}
    start = time.perf_counter()
    try:
        for case in random_cases(n, seed):
            signal.alarm(30)
            try:
                code, _, err = cli(*case.argv(str(tmp_path)))
            finally:
                signal.alarm(0)
            left = sorted(p.name for p in tmp_path.iterdir())
            if code not in codes or (code == 2 and (err.count("\n") != 1 or "Traceback" in err)):
                failures.append(f"{case.id}: exit {code}, {err[:200]!r}")
            elif left != files and code == 2:
                failures.append(f"{case.id}: refused but left {sorted(set(left) - set(files))}")
            else:
                codes[code] += 1
            for name in set(left) - set(files):  # a valid mutation's output, removed for the next case
                (tmp_path / name).unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    rss_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"\nsoak: {n} cases (seed {seed}) in {time.perf_counter() - start:.0f} s: {codes[2]} refused, "
        f"{codes[0]} valid, {len(failures)} failures; peak RSS {rss_start / 1024:.0f} -> {rss_end / 1024:.0f} MiB"
    )
    assert not failures, f"seed {seed}: " + "\n".join(failures[:20])
