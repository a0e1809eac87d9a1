"""Run independent simulation points serially or as Ray tasks, with progress.

Ray is optional (`pip install 'kvpool[sweep]'`). `run_all(fn, items)` returns
`fn(item)` for every item, in item order, whichever way it ran: each point is
a pure function of its inputs, so a Ray run gives the same results as a
serial one. `workers=None` or 1 runs serially in this process; more workers
(or a `ray_address`) run on Ray: a local cluster of `workers` CPUs started
with `ray.init`, or the existing cluster at `ray_address` (`auto`, or
`ray://HOST:10001`), whose nodes need kvpool installed. Without Ray the points
run serially and `how` says so.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvpool.errors import KvpoolError

T = TypeVar("T")
R = TypeVar("R")


def ray_available() -> bool:
    """Whether `import ray` would work (without importing it)."""
    return importlib.util.find_spec("ray") is not None


class Bar:
    """A progress bar over points on stderr: tqdm when installed, else one line
    per finished point (nothing when disabled)."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.enabled, self.total, self.done, self.label = enabled, total, 0, label
        self.t0 = time.monotonic()
        self._tqdm: Any = None
        if enabled and importlib.util.find_spec("tqdm") is not None:
            from tqdm import tqdm  # type: ignore[import-untyped,import-not-found]

            self._tqdm = tqdm(total=total, desc=label, unit="point", file=sys.stderr)

    def step(self, what: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(what[:40], refresh=False)
            self._tqdm.update(1)
        else:
            print(
                f"{self.label}: {self.done}/{self.total} points, "
                f"{time.monotonic() - self.t0:.0f} s{': ' + what if what else ''}",
                file=sys.stderr,
            )

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def run_all(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    bar: Bar | None = None,
    describe: Callable[[T], str] = lambda _: "",
) -> tuple[list[R], str]:
    """`[fn(x) for x in items]`, serially or on Ray (module docstring), and one
    line on how it ran. `fn` must be a module-level function for Ray.
    Raises KvpoolError when `ray_address` is given and Ray is missing."""
    if workers is not None and workers < 1:
        raise KvpoolError(f"--workers must be positive, got {workers}")
    wants_ray = ray_address is not None or (workers or 1) > 1
    if wants_ray and not ray_available():
        if ray_address is not None:
            raise KvpoolError("--ray-address needs Ray: pip install 'kvpool[sweep]'")
        return _serial(fn, items, bar, describe), (
            f"Ray is not installed (pip install 'kvpool[sweep]'): ran {len(items)} points serially"
        )
    if not wants_ray:
        return _serial(fn, items, bar, describe), f"ran {len(items)} points serially"
    return _on_ray(fn, items, workers, ray_address, bar, describe)


def _serial(fn: Callable[[T], R], items: Sequence[T], bar: Bar | None, describe: Callable[[T], str]) -> list[R]:
    out = []
    for x in items:
        out.append(fn(x))
        if bar is not None:
            bar.step(describe(x))
    return out


def _on_ray(
    fn: Callable[[T], R],
    items: Sequence[T],
    workers: int | None,
    address: str | None,
    bar: Bar | None,
    describe: Callable[[T], str],
) -> tuple[list[R], str]:
    import ray as ray_module  # type: ignore[import-not-found]

    ray: Any = ray_module  # partly untyped
    started = not ray.is_initialized()
    if started:
        _start_ray(ray, workers, address)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        results = _gather(ray, fn, items, bar, describe)
        return results, (f"ran {len(items)} points as Ray tasks on {address or 'a local Ray'} ({cpus} CPUs)")
    finally:
        if started:
            ray.shutdown()


def _start_ray(ray: Any, workers: int | None, address: str | None) -> None:
    """Start a local Ray of `workers` CPUs, or join the cluster at `address`."""
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None:
        kwargs["num_cpus"] = workers
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise KvpoolError(f"cannot start or reach Ray ({address or 'local'}): {e}") from None


def _gather(
    ray: Any, fn: Callable[[T], R], items: Sequence[T], bar: Bar | None, describe: Callable[[T], str]
) -> list[R]:
    """`fn` over `items` as Ray tasks, the results in `items`' order; the bar
    steps as each task finishes, in whatever order."""
    remote = ray.remote(num_cpus=1)(fn)
    refs = [remote.remote(x) for x in items]
    where = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(items)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            i = where[ref]
            results[i] = ray.get(ref)
            if bar is not None:
                bar.step(describe(items[i]))
    return results
