"""`fit`: will it fit, and how do I launch it? (`kvpool fit`, `kvpool serve`)

With `max_seq_len` (or neither): one layout (N GPUs as tensor parallelism unless
tp / pp say otherwise; GPUs left over are data-parallel replicas), the whole-GPU
memory breakdown per rank, and per engine the verdict, its budget flags, KV per
rank, requests that fit, CUDA-graph sizes and the launch line (`engine_fit.py`).
With `users=N, length=L`: the layouts that hold N requests of L positions at
once, ranked (`layouts.py`), then the engines on the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from kvpool import presets
from kvpool.deploy.engine_fit import EngineFit, engine_fit, fit_lengths
from kvpool.deploy.gpus import MAX_GPUS, split_gpu
from kvpool.deploy.launch import launch_model_id
from kvpool.deploy.layouts import Layout, ranked
from kvpool.deploy.layouts import search as search_layouts
from kvpool.deploy.options import ModelOptions, PlanKeywords, PlanRequest
from kvpool.deploy.resolution import Resolved, resolve
from kvpool.deploy.tiers import TierOptions
from kvpool.engines import registry
from kvpool.errors import KvpoolError, SpecError
from kvpool.plan import PoolPlan
from kvpool.plan.tiers import TierPlan
from kvpool.spec import loader as spec_loader
from kvpool.spec.loader import read_model_config

GPUS_PER_NODE = 8  # tensor parallelism stays inside one node (layouts.py); its GPUs share its host memory
ENGINE_RULES: dict[str, str] = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}


@dataclass(frozen=True)
class FitTiers:
    """The cold tiers `fit` sizes per engine: the node's `host_memory` for KV, a
    `disk` tier per rank, `host_rule` (None: each engine's own, `plan/tiers.py`)
    and `ranks_per_node` (None: the GPUs asked for, at most 8)."""

    host_memory: str | None = None
    disk: str | None = None
    host_rule: str | None = None
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.host_memory is None and (self.host_rule is not None or self.ranks_per_node is not None):
            raise KvpoolError(
                "--host-rule / --ranks-per-node say how the node's host memory is shared: add --host-memory"
            )

    def for_engine(self, engine: str, plan: PoolPlan, model: ModelOptions, gpus: int) -> list[TierPlan]:
        """One rank's cold tiers below `plan` as `engine` sizes its host tier."""
        if self.host_memory is None and self.disk is None:
            return []
        rule = "even" if self.host_memory is None else self.host_rule or ENGINE_RULES[engine]
        ranks = self.ranks_per_node or min(gpus, GPUS_PER_NODE)
        return TierOptions(self.host_memory, self.disk, rule, ranks).per_rank(plan, model.tp, model.pp)


@dataclass(frozen=True)
class Search:
    """The layouts searched for `users` requests of `length` positions, up to
    `max_gpus`: `layouts` those that hold them (ranked), `tried` the others."""

    users: int
    length: int
    max_gpus: int
    layouts: tuple[Layout, ...]
    tried: tuple[Layout, ...]

    @property
    def best(self) -> Layout | None:
        return self.layouts[0] if self.layouts else None

    @property
    def closest(self) -> Layout | None:
        """What falls short, closest: the layout that holds the most when none holds
        the users, else the one that holds the most with fewer GPUs than the first
        that does (None when there is none)."""
        best = self.best
        short = [x for x in self.tried if best is None or x.gpus < best.gpus]
        return max(short, key=lambda x: (x.holds, x.reason is None, x.gpus), default=None)


@dataclass(frozen=True)
class FitResult:
    """What `fit` answers. `resolved` and `plan`: the layout the engines answered
    on (with `search`, the first layout that holds the users; None when none
    does); `engines` each engine's answer; `search` the layouts, with `users`.
    `to_dict()` is what `kvpool fit --json` prints."""

    model: str
    gpu: str
    count: int
    resolved: Resolved | None
    plan: PoolPlan | None
    engines: tuple[EngineFit, ...]
    search: Search | None = None

    @property
    def error(self) -> str | None:
        """Why the answer is no (the CLI's exit 2): no engine starts, or no layout
        holds the users; None when something fits."""
        if self.search is not None:
            s = self.search
            held = s.best is not None
            return (
                None if held else f"no layout up to {s.max_gpus} GPUs holds {s.users} requests of {s.length} positions"
            )
        if any(f.starts for f in self.engines):
            return None
        return f"no engine starts: {self.engines[0].reasons[0]}"

    def to_dict(self) -> dict[str, Any]:
        if self.search is None:
            assert self.resolved is not None and self.plan is not None
            model = self.resolved.request.model
            out: dict[str, Any] = {
                "model": self.resolved.spec.name,
                "gpu": self.gpu,
                "gpus": self.count,
                "layout": {"tp": model.tp, "pp": model.pp, "replicas": self.resolved.request.replicas},
            }
        else:
            out = {
                "model": self.model,
                "gpu": self.gpu,
                "users": self.search.users,
                "len": self.search.length,
                "max_gpus": self.search.max_gpus,
                "layouts": [x.to_json() for x in self.search.layouts],
                "tried": [x.to_json() for x in self.search.tried],
                "closest": None if self.search.closest is None else self.search.closest.to_json(),
            }
        if self.resolved is not None and self.plan is not None:
            out.update(summary(self.resolved), pools=pools_json(self.plan))
        out["engines"] = [f.to_json() for f in self.engines]
        return out


def parse_engines(engines: str | Sequence[str]) -> tuple[str, ...]:
    """`all`, or a comma list (or a sequence) of ENGINE[@RELEASE]: the engines, by
    bare name. The launch lines follow each engine's newest modelled release, so an
    older one is refused."""
    text = engines if isinstance(engines, str) else ",".join(engines)
    every = registry.NAMES
    if text.strip().lower() == "all":
        return every
    if any(not e.strip() for e in text.split(",")):
        raise KvpoolError(f"--engine {text!r} has an empty item; choose from {', '.join(every)} or all")
    names = []
    for item in (e.strip().lower() for e in text.split(",")):
        try:
            engine, release = registry.engine_name(item)
        except KvpoolError:
            raise KvpoolError(f"--engine {text!r}: choose from {', '.join(every)} or all") from None
        newest = registry.RELEASES[engine][0]
        if release != newest:
            raise KvpoolError(f"fit states {engine}@{newest}'s launch; {item} is for kvpool plan --engine")
        names.append(engine)
    return tuple(dict.fromkeys(names))


def fit(
    model: str,
    *,
    gpu: str,
    engines: str | Sequence[str] = "all",
    users: int | None = None,
    length: int | None = None,
    model_id: str | None = None,
    host_memory: int | str | None = None,
    disk: int | str | None = None,
    host_rule: str | None = None,
    ranks_per_node: int | None = None,
    **options: Unpack[PlanKeywords],
) -> FitResult:
    """Size a deployment of `model` on whole GPUs (`gpu`: a preset, `NAMExN` for N
    of them, or `auto`) and answer per engine (`engines`: `all`, or names such as
    "vllm,sglang"): does it start, with which budget flags, how much KV per rank,
    how many requests fit at once, which CUDA-graph batch sizes keep graphs, and
    the launch line (named `model_id`, default the hub id). With `users` and
    `length`: the layouts that hold that many requests of that length at once,
    ranked, searched up to N GPUs (up to 64 without a count), then the engines on
    the first. `host_memory` (one node's, for KV) and `disk` (per rank): the cold
    tiers below each engine's pools, sized by each engine's own rule unless
    `host_rule` says one (`ranks_per_node`: the GPUs sharing the node's memory,
    default the GPUs asked for, at most 8), stated in its launch line. `options`:
    the `PlanKeywords` (limits, budget parts, kv_dtype, tp, ...). Raises KvpoolError on bad input; a deployment that does not fit is an
    answer (`FitResult.error`), not an exception.

    >>> fit("qwen3-32b", gpu="h100x2", max_seq_len=32768).engines[0].verdict
    'starts'
    """
    names = parse_engines(engines)
    size = {k: None if v is None else str(v) for k, v in (("host_memory", host_memory), ("disk", disk))}
    cold = FitTiers(**size, host_rule=host_rule, ranks_per_node=ranks_per_node)
    if (users is None) != (length is None):
        raise KvpoolError("give --users N and --len L together")
    check_users_layout(users, options)
    request = PlanRequest.of(model, gpu, whole_gpus=True, **options)
    gpu_name = presets.load_gpu(str(request.budget.gpu)).name
    if users is not None and length is not None:
        cap = split_gpu(gpu)[1] or MAX_GPUS  # NAMExN searches up to N GPUs (h100x1: one), NAME up to 64
        return fit_users(request, gpu_name, Engines(names, model_id, cold), Wanted(users, length, cap))
    check_implied_tp(gpu, request, options)
    resolved = resolve(request, gpu_only_for_budget=False)  # --gpu also counts the GPUs
    plan = resolved.plan()
    fits = Engines(names, model_id, cold).answer(resolved, plan, None, request.count)
    return FitResult(resolved.spec.name, gpu_name, request.count, resolved, plan, fits)


def check_users_layout(users: int | None, options: PlanKeywords) -> None:
    """`users` ranks the layouts (tp, pp, replicas) itself: a layout given beside it
    would be silently replaced by each ranked layout's own, so it is refused."""
    layout = [f"--{k}" for k in ("tp", "pp", "dp") if options.get(k, 1) != 1]
    if users is not None and layout:
        raise KvpoolError(
            f"--users N --len L ranks the layouts (tp, pp, replicas) itself: drop {' / '.join(layout)}, "
            "or give --max-seq-len instead to size that one layout"
        )


def check_implied_tp(gpu: str, request: PlanRequest, options: PlanKeywords) -> None:
    """N GPUs without tp / pp are one engine of tensor-parallel size N: refused in
    terms of `gpu` (no --tp was given) when N does not split the model's attention
    heads, as vLLM and SGLang refuse it."""
    tp = request.model.tp
    if tp == 1 or options.get("tp", 1) != 1 or options.get("pp", 1) != 1:
        return  # no GPU count, or a layout given: resolve checks it as --tp
    config = read_model_config(request.model.model)[2]
    try:
        spec_loader.check_tp_divides_heads(config, tp)
    except SpecError:
        raise KvpoolError(
            f"--gpu {gpu}: one engine over {tp} GPUs splits the model's {config.get('num_attention_heads')} "
            f"attention heads {tp} ways (vLLM and SGLang refuse it); give a GPU count that divides them, "
            "--tp/--pp for the layout, or --users N --len L to rank the layouts"
        ) from None


@dataclass(frozen=True)
class Wanted:
    """`users` requests of `length` positions at once, on at most `max_gpus` GPUs."""

    users: int
    length: int
    max_gpus: int


def check_users_request(request: PlanRequest) -> None:
    """What a layout search cannot honour is refused: its length is --len, and it
    sizes every layout by kvpool's default split."""
    if request.limits.max_seq_len is not None:
        raise KvpoolError("--len is the max_seq_len of --users: drop --max-seq-len")
    policy = [f for f, v in (("--pool-ratio", request.pool_ratio), ("--workload", request.workload)) if v]
    if policy or request.shrink_to_fit:
        raise KvpoolError(f"--users searches layouts with kvpool's default split: drop {' / '.join(policy) or '--fit'}")


def fit_users(request: PlanRequest, gpu_name: str, engines: Engines, wanted: Wanted) -> FitResult:
    """The layouts that hold `users` requests of `length`, and the engines on the first."""
    check_users_request(request)
    users, length, max_gpus = wanted.users, wanted.length, wanted.max_gpus
    found = search_layouts(request, users, length, max_gpus)
    good = ranked(found, users)
    search = Search(users, length, max_gpus, tuple(good), tuple(x for x in found if x not in good))
    best = search.best
    if best is None or best.resolved is None:
        return FitResult(request.model.model, gpu_name, request.count, None, None, (), search)
    plan = best.resolved.plan()
    fits = engines.answer(best.resolved, plan, length, best.gpus)
    return FitResult(request.model.model, gpu_name, request.count, best.resolved, plan, fits, search)


@dataclass(frozen=True)
class Engines:
    """The engines to answer for, the model id their launch lines name (None: the
    hub id) and the cold tiers below their pools."""

    names: tuple[str, ...]
    model_id: str | None
    tiers: FitTiers

    def answer(self, resolved: Resolved, plan: PoolPlan, length: int | None, gpus: int) -> tuple[EngineFit, ...]:
        """Each engine's answer on `plan`, the plan of `resolved`, on `gpus` GPUs."""
        launch_id = launch_model_id(plan, resolved.request.model.model, self.model_id)
        lengths, memory, model = fit_lengths(plan, length), resolved.budget.memory, resolved.request.model
        return tuple(
            engine_fit(e, plan, launch_id, memory, lengths, model.parallel, self.tiers.for_engine(e, plan, model, gpus))
            for e in self.names
        )


def pools_json(plan: PoolPlan) -> list[dict[str, Any]]:
    """kvpool's split of the KV budget between the model's page pools."""
    return [
        {
            "name": g.name,
            "kind": g.kind,
            "page_bytes": g.page_bytes,
            "pages": g.pages,
            "bytes": g.bytes,
            "share": g.share,
        }
        for g in plan.groups
    ]


def summary(resolved: Resolved) -> dict[str, Any]:
    lim, memory = resolved.limits, resolved.budget.memory
    return {
        "limits": {
            "max_seq_len": lim.max_seq_len,
            "max_batch_size": lim.max_batch_size,
            "max_num_tokens": lim.max_num_tokens,
        },
        "kv_bytes_per_rank": resolved.budget.kv_bytes,
        "memory": None if memory is None else memory.to_json(),
    }
