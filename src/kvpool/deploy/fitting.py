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
from kvpool.deploy.gpus import MAX_GPUS
from kvpool.deploy.launch import launch_model_id
from kvpool.deploy.layouts import Layout, ranked
from kvpool.deploy.layouts import search as search_layouts
from kvpool.deploy.options import PlanKeywords, PlanRequest
from kvpool.deploy.resolution import Resolved, resolve
from kvpool.engines.emit import ENGINES, RELEASES, engine_name
from kvpool.errors import KvpoolError
from kvpool.plan import PoolPlan


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
                "layouts": [x.to_json() for x in self.search.layouts],
                "tried": [x.to_json() for x in self.search.tried],
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
    if text.strip().lower() == "all":
        return ENGINES
    if any(not e.strip() for e in text.split(",")):
        raise KvpoolError(f"--engine {text!r} has an empty item; choose from {', '.join(ENGINES)} or all")
    names = []
    for item in (e.strip().lower() for e in text.split(",")):
        try:
            engine, release = engine_name(item)
        except KvpoolError:
            raise KvpoolError(f"--engine {text!r}: choose from {', '.join(ENGINES)} or all") from None
        if release != RELEASES[engine][0]:
            raise KvpoolError(f"fit states {engine}@{RELEASES[engine][0]}'s launch; {item} is for kvpool plan --engine")
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
    **options: Unpack[PlanKeywords],
) -> FitResult:
    """Size a deployment of `model` on whole GPUs (`gpu`: a preset, `NAMExN` for N
    of them, or `auto`) and answer per engine (`engines`: `all`, or names such as
    "vllm,sglang"): does it start, with which budget flags, how much KV per rank,
    how many requests fit at once, which CUDA-graph batch sizes keep graphs, and
    the launch line (named `model_id`, default the hub id). With `users` and
    `length`: the layouts that hold that many requests of that length at once,
    ranked, searched up to N GPUs (up to 64 without a count), then the engines on
    the first. `options`: the `PlanKeywords` (limits, budget parts, kv_dtype, tp,
    ...). Raises KvpoolError on bad input; a deployment that does not fit is an
    answer (`FitResult.error`), not an exception.

    >>> fit("qwen3-32b", gpu="h100x2", max_seq_len=32768).engines[0].verdict
    'starts'
    """
    names = parse_engines(engines)
    if (users is None) != (length is None):
        raise KvpoolError("give --users N and --len L together")
    request = PlanRequest.of(model, gpu, whole_gpus=True, **options)
    gpu_name = presets.load_gpu(str(request.budget.gpu)).name
    if users is not None and length is not None:
        return fit_users(request, gpu_name, names, users, length, model_id)
    resolved = resolve(request, gpu_only_for_budget=False)  # --gpu also counts the GPUs
    plan = resolved.plan()
    fits = answer_engines(resolved, plan, names, None, model_id)
    return FitResult(resolved.spec.name, gpu_name, request.count, resolved, plan, fits)


def fit_users(
    request: PlanRequest, gpu_name: str, names: tuple[str, ...], users: int, length: int, model_id: str | None
) -> FitResult:
    """The layouts that hold `users` requests of `length`, and the engines on the first."""
    if request.limits.max_seq_len is not None:
        raise KvpoolError("--len is the max_seq_len of --users: drop --max-seq-len")
    max_gpus = request.count if request.count > 1 else MAX_GPUS
    found = search_layouts(request, users, length, max_gpus)
    good = ranked(found, users)
    search = Search(users, length, max_gpus, tuple(good), tuple(x for x in found if x not in good))
    best = search.best
    if best is None or best.resolved is None:
        return FitResult(request.model.model, gpu_name, request.count, None, None, (), search)
    plan = best.resolved.plan()
    fits = answer_engines(best.resolved, plan, names, length, model_id) if best.pp == 1 else ()
    return FitResult(request.model.model, gpu_name, request.count, best.resolved, plan, fits, search)


def answer_engines(
    resolved: Resolved, plan: PoolPlan, engines: tuple[str, ...], length: int | None, model_id: str | None
) -> tuple[EngineFit, ...]:
    """Each engine's answer on `plan`, the plan of `resolved`."""
    launch_id = launch_model_id(plan, resolved.request.model.model, model_id)
    lengths = fit_lengths(plan, length)
    return tuple(engine_fit(e, plan, launch_id, resolved.budget.memory, lengths) for e in engines)


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
