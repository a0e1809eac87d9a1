"""`--kv-events ENDPOINT` (and `--kv-events-replay`, `--kv-events-topic`,
`--kv-events-wire`, `--kv-events-media`):
publish the manager's page events in vLLM's wire format while a command runs
(`kvpool.cache.publisher`; needs the extra `kvpool[events]`). `--hash-lookahead
L`: the manager hashes each page with the L ids after it, as vLLM 0.33 does
with an EAGLE-family drafter, so its reuse and its events (with
`lookahead_token_ids`) are that engine's; with or without `--kv-events`."""

from __future__ import annotations

import argparse
import atexit
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvpool.cli.common import int_at_least
from kvpool.errors import KvpoolError

if TYPE_CHECKING:
    from kvpool.cache import KVCacheManager
    from kvpool.cache.publisher import KVEventPublisher
    from kvpool.spec.groups import LayerGroup


def add_kv_events_args(group: Any) -> None:
    """Add the options to an argparse group."""
    group.add_argument(
        "--kv-events",
        default=None,
        metavar="ENDPOINT",
        help="publish KV events as vLLM does (ZMQ PUB, e.g. tcp://*:5557 binds, "
        "tcp://HOST:PORT connects; needs kvpool[events])",
    )
    group.add_argument(
        "--kv-events-replay",
        default=None,
        metavar="ENDPOINT",
        help="ROUTER endpoint answering replay requests (e.g. tcp://*:5558)",
    )
    group.add_argument(
        "--kv-events-topic", default="", metavar="TOPIC", help="topic frame of every message (default empty, as vLLM's)"
    )
    group.add_argument(
        "--kv-events-wire",
        default=None,
        choices=("map", "array"),
        help="event encoding: map (named fields, vLLM since PR #42892; default) or array (positional, older vLLM)",
    )
    group.add_argument(
        "--kv-events-media",
        default=None,
        choices=("vllm", "kvpool"),
        help="tier names in `medium`: vllm (GPU, CPU, STORAGE; default) or kvpool (GPU, CPU, DISK)",
    )
    group.add_argument(
        "--hash-lookahead",
        type=int_at_least(0),
        default=0,
        metavar="L",
        help="hash each page with the L token ids after it, as vLLM 0.33 does with an EAGLE-family drafter "
        "(1 for EAGLE / EAGLE-3, the draft length for multi-module MTP): a page is cached once they exist, "
        "a prefix hit needs them equal, stored events carry lookahead_token_ids (default 0: off)",
    )


def open_publisher(args: argparse.Namespace, groups: Sequence[LayerGroup]) -> KVEventPublisher | None:
    """The publisher `--kv-events` asks for (closed at exit), or None. One
    that connects first waits up to 1 s for the subscriber's handshake."""
    if args.kv_events is None:
        # flags that mean nothing without --kv-events are refused, not ignored
        if args.kv_events_replay is not None:
            raise KvpoolError("--kv-events-replay needs --kv-events")
        if args.kv_events_topic:
            raise KvpoolError("--kv-events-topic needs --kv-events")
        for flag in ("wire", "media"):
            if getattr(args, f"kv_events_{flag}") is not None:
                raise KvpoolError(f"--kv-events-{flag} needs --kv-events")
        return None
    try:
        from kvpool.cache.publisher import KVEventPublisher
    except ImportError as exc:
        raise KvpoolError(f"--kv-events needs pyzmq and msgspec: pip install 'kvpool[events]' ({exc})") from exc
    try:
        pub = KVEventPublisher(
            args.kv_events,
            groups,
            replay_endpoint=args.kv_events_replay,
            topic=args.kv_events_topic,
            wire=args.kv_events_wire or "map",
            media=args.kv_events_media or "vllm",
            connect_wait_s=1.0,
        )
    except KvpoolError as e:
        raise KvpoolError(f"--kv-events {args.kv_events!r}: {e}") from None
    atexit.register(pub.close)
    return pub


def step_publisher(pub: KVEventPublisher | None) -> Callable[[KVCacheManager], None] | None:
    """A per-step callback that publishes a new manager's events: it first sends
    `AllBlocksCleared` (subscribers forget the previous run), then one batch per call."""
    if pub is None:
        return None
    pub.publish_cleared()

    def publish(manager: KVCacheManager) -> None:
        pub.publish(manager.take_events())

    return publish
