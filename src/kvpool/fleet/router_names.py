"""The routers' names alone, as the CLI offers them (`--router`): reading them
loads no router (the kv router loads `kvpool.index`). `fleet.registry` builds
the routers from their classes; tests/test_fleet_routers.py checks that the
two name the same routers."""

from __future__ import annotations

KV_VARIANTS = ("dynamo", "sglang")  # the kv router's costs, its default first
ROUTER_NAMES = ("round-robin", "least-load", "prefix", "kv", *(f"kv:{v}" for v in KV_VARIANTS[1:]))
