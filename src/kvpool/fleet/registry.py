"""Routers by name, as the CLI and a fleet's spec name them."""

from __future__ import annotations

from typing import Any

from kvpool.fleet.kv_router import KvRouter
from kvpool.fleet.load import RouterError
from kvpool.fleet.prefix_router import PrefixRouter
from kvpool.fleet.router_names import ROUTER_NAMES  # the names alone (the CLI's), checked against ROUTERS by the tests
from kvpool.fleet.routers import LeastLoad, RoundRobin, Router

ROUTERS: dict[str, type[Router]] = {r.name: r for r in (RoundRobin, LeastLoad, PrefixRouter, KvRouter)}


def make_router(name: str, workers: int, **options: Any) -> Router:
    """A router by name: `round-robin`, `least-load`, `prefix`, `kv` (Dynamo's
    cost) or `kv:sglang` (SGLang's rule on the index), for `workers` workers;
    `options` go to its constructor. RouterError for an unknown name or option."""
    base, _, variant = name.partition(":")
    if base not in ROUTERS:
        raise RouterError(f"unknown router {name!r}; routers: {', '.join(ROUTER_NAMES)}")
    if variant:
        if base != KvRouter.name:
            raise RouterError(f"router {base!r} has no variants; kv has {', '.join(KvRouter.VARIANTS)}")
        options = {**options, "variant": variant}
    try:
        return ROUTERS[base](workers, **options)
    except TypeError as e:
        raise RouterError(f"router {name!r}: {e}") from None
