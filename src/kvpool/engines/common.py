"""What an engine model returns: the pools an engine would create, the numbers it
would print, and what it would refuse or degrade.

Every engine module (`vllm`, `sglang`, `trtllm`) turns (spec, limits, KV bytes per
rank) into an `EngineReport` in three steps behind one protocol, `EngineModel`:
`size` (the engine's own arithmetic, a frozen `Sizing`), `pools` (the pools that
sizing buys) and `report` (what the engine prints, refuses and degrades);
`allocate_with` runs them. A model object carries the engine's options and names
the release it reproduces (`vllm@0.32`). A pool's `members` are page-arithmetic groups at the
engine's own page size; a request of shape (capacity, history) takes
`sum(pages_needed(m, capacity, history) for m in members)` pages of that pool,
so concurrency is counted by kvpool's one page arithmetic (docs/design.md, rule 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kvpool.errors import KvpoolError, LimitsError
from kvpool.plan.batches import REFERENCE_REQUEST, decode_shape
from kvpool.plan.limits import ServingLimits
from kvpool.spec import Kind, LayerGroup, ModelSpec, pages_needed


class EngineNotModelledError(KvpoolError):
    """A model (or option) whose layout in that engine kvpool does not model."""


@dataclass(frozen=True)
class EnginePool:
    """One pool an engine allocates: `pages` slots of `page_bytes` each.

    `page_tokens` is the engine's tokens per page (0 for a state pool, whose slot
    is one request's state); `tokens` what the engine reports for the pool (None
    when it reports none); `groups` the kvpool groups whose layers live in it.
    """

    name: str
    page_tokens: int
    page_bytes: int
    pages: int
    groups: tuple[str, ...]
    members: tuple[LayerGroup, ...]
    tokens: int | None = None

    @property
    def bytes(self) -> int:
        return self.page_bytes * self.pages

    def need(self, capacity: int, history: int) -> int:
        """Pages of this pool one request of (capacity, history) holds."""
        return sum(pages_needed(m, capacity, history) for m in self.members)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "groups": list(self.groups),
            "page_tokens": self.page_tokens,
            "page_bytes": self.page_bytes,
            "pages": self.pages,
            "tokens": self.tokens,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class EngineReport:
    """What one engine would allocate for a deployment, and what it would print.

    `reported` holds the engine's own numbers by name, `lines` the log lines it
    would print with them; `refusals` are start-up failures (the engine exits),
    `degradations` what it would accept but run worse than planned, `notes` how
    the model was read. `group_pages` expresses the split as kvpool pages per
    group (at the spec's page size) where the pools map one to one onto groups,
    else None (vLLM's shared pool).
    """

    engine: str
    version_modelled: str
    sources: tuple[str, ...]
    limits: ServingLimits
    budget_bytes: int
    pools: tuple[EnginePool, ...]
    reported: Mapping[str, Any] = field(default_factory=dict)
    lines: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()
    degradations: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    group_pages: Mapping[str, int] | None = None

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.pools)

    def pool(self, name: str) -> EnginePool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KvpoolError(f"{self.engine} has no pool {name!r}; pools: {[p.name for p in self.pools]}")

    def max_requests(self, shape: tuple[int, int]) -> int:
        """Requests of one (capacity, history) shape the pools hold at once."""
        counts = [p.pages // n for p in self.pools if (n := p.need(shape[0], shape[1]))]
        return min(counts) if counts else 0

    def max_concurrency(self, avg_seq_len: int | None = None) -> dict[str, int | None]:
        """Requests that fit at once, as `PoolPlan.max_concurrency` counts them."""
        lim = self.limits
        return {
            "reference": self.max_requests(REFERENCE_REQUEST),
            "avg_seq_len": None if avg_seq_len is None else self.max_requests(decode_shape(avg_seq_len, lim)),
            "max_seq_len": self.max_requests(decode_shape(lim.max_seq_len, lim)),
        }

    def to_json(self, avg_seq_len: int | None = None) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version_modelled": self.version_modelled,
            "sources": list(self.sources),
            "budget_bytes": self.budget_bytes,
            "total_bytes": self.total_bytes,
            "pools": [p.to_json() for p in self.pools],
            "reported": dict(self.reported),
            "lines": list(self.lines),
            "max_concurrency": self.max_concurrency(avg_seq_len),
            "refusals": list(self.refusals),
            "degradations": list(self.degradations),
            "notes": list(self.notes),
        }


def per_layer_bytes(group: LayerGroup) -> int:
    """One layer's share of a group's row (or state) bytes; the layers of a group
    are identical, so the division is exact."""
    total = group.state_bytes if group.kind == "state" else group.row_bytes
    n = len(group.layers)
    if n == 0 or total % n:
        raise EngineNotModelledError(f"group {group.name}: {total} bytes do not split over {n} layers")
    return total // n


def refuse_kinds(spec: ModelSpec, kinds: frozenset[str], engine: str) -> None:
    """EngineNotModelledError naming each group of a kind the engine model does not
    size (`kinds`: the kinds it declares), so that a kind added to spec/ is refused
    by name rather than sized as another (compressed attention, DeepSeek-V4's, is
    one: its layout in the engines is not modelled)."""
    other = [f"{g.name} ({g.kind})" for g in spec.groups if g.kind not in kinds]
    if other:
        raise EngineNotModelledError(
            f"kvpool does not model {engine}'s layout for the groups {', '.join(other)} of {spec.name}; "
            f"its model sizes {', '.join(sorted(kinds))} groups"
        )


def member(
    name: str, kind: Kind, tokens_per_block: int, *, window: int | None = None, row_bytes: int = 1, layers: int = 1
) -> LayerGroup:
    """A page-arithmetic group at an engine's page size (only its kind, window and
    tokens per block matter for counting pages)."""
    if kind == "state":
        return LayerGroup(name, "state", tuple(range(layers)), max(tokens_per_block, 1), state_bytes=1)
    return LayerGroup(name, kind, tuple(range(layers)), tokens_per_block, row_bytes=row_bytes, window=window)


@dataclass(frozen=True)
class Sizing:
    """What an engine's sizing step decided, before any pool is built.

    Engines subclass it (frozen) to carry their own intermediate numbers;
    `refusals` here stop the engine at start-up (`pools` then builds none),
    `degradations` and `notes` pass through to the report.
    """

    spec: ModelSpec
    limits: ServingLimits
    budget_bytes: int
    refusals: tuple[str, ...] = ()
    degradations: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


S = TypeVar("S", bound=Sizing)


class EngineModel(Protocol[S]):
    """One engine release's allocation rules: sizing -> pools -> report.

    `engine` is the name the CLI takes (`vllm`), `release` the version whose code
    the model reproduces (`0.32`), `sources` the files read for it. Options (block
    size, ratios, scheduling) are fields of the implementing object.
    """

    @property
    def engine(self) -> str: ...

    @property
    def release(self) -> str: ...

    @property
    def sources(self) -> tuple[str, ...]: ...

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> S:
        """The engine's own arithmetic on (spec, limits, KV bytes per rank)."""
        ...

    def pools(self, sizing: S) -> tuple[EnginePool, ...]:
        """The pools `sizing` buys (none when it refuses)."""
        ...

    def report(self, sizing: S, pools: tuple[EnginePool, ...]) -> EngineReport:
        """What the engine prints, refuses and degrades for `sizing` and `pools`."""
        ...


def allocate_with(model: EngineModel[S], spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> EngineReport:
    """Run `model` on one deployment: size, build the pools, report."""
    if kv_memory_bytes < 1:
        raise LimitsError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}")
    sizing = model.size(spec, limits, kv_memory_bytes)
    return model.report(sizing, model.pools(sizing))


# Other names the CLI takes for an engine@release (`trtllm-v1`: TensorRT-LLM's old C++ manager).
ENGINE_ALIASES = {"trtllm-v1": "trtllm@v1"}


def split_engine_name(name: str, releases: Mapping[str, tuple[str, ...]]) -> tuple[str, str]:
    """`vllm` -> (vllm, newest verified release), `vllm@0.32` -> (vllm, 0.32);
    an alias of `ENGINE_ALIASES` (`trtllm-v1`) -> what it names (trtllm, v1).

    `releases` maps each engine to its modelled releases, newest first.
    """
    engine, at, release = ENGINE_ALIASES.get(name, name).partition("@")
    if engine not in releases:
        raise EngineNotModelledError(f"unknown engine {engine!r}; choose one of {', '.join(releases)}")
    known = releases[engine]
    if at and not release:  # `vllm@` is a release left out, not the newest one asked for
        raise EngineNotModelledError(
            f"{name!r} names no release; give {engine} or {engine}@RELEASE ({', '.join(known)})"
        )
    if not release:
        return engine, known[0]
    if release not in known:
        raise EngineNotModelledError(f"{engine}@{release} is not modelled; releases: {', '.join(known)}")
    return engine, release
