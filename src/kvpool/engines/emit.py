"""The launch command (vLLM, SGLang) or extra-options YAML (TensorRT-LLM) that
makes an engine follow a kvpool plan as closely as its flags can say it, with
one note per part of the plan the engine cannot express and what that costs.

`emit(engine, plan, model_id)` returns an `Emitted`; its `report` is what the
engine would allocate when launched that way (its own model, same memory).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvpool.engines import sglang, trtllm, vllm
from kvpool.engines.common import EngineNotModelledError, EngineReport
from kvpool.engines.hf_ids import HF_IDS as HF_IDS
from kvpool.engines.hf_ids import model_id_for as model_id_for
from kvpool.engines.hicache import sglang_host_pools
from kvpool.media import Medium
from kvpool.models.weights import Parallel
from kvpool.plan import GroupPlan, PoolPlan
from kvpool.plan.tiers import GiB, TierPlan
from kvpool.spec import ModelSpec, load_model_spec
from kvpool.spec.dtypes import engine_auto_dtype
from kvpool.units import format_bytes

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# SGLang 0.5.23 split --cuda-graph-bs into --cuda-graph-bs-decode / -prefill (the
# old name is refused as ambiguous by its parser).
SGLANG_GRAPH_FLAG = "--cuda-graph-bs-decode"


@dataclass(frozen=True)
class Emitted:
    """An engine's launch: `argv` (vLLM, SGLang) or `config` (TensorRT-LLM YAML
    fields), `notes` on what it cannot express, `report` its allocation then."""

    engine: str
    argv: tuple[str, ...] | None
    config: dict[str, Any] | None
    notes: tuple[str, ...]
    report: EngineReport

    def text(self) -> str:
        """The command line (shell-quoted) or the YAML document, then the notes."""
        if self.argv is not None:
            body = " ".join(_quote(a) for a in self.argv)
        else:
            assert self.config is not None
            body = to_yaml(self.config).rstrip("\n")
        return "\n".join([body, *(f"# note: {n}" for n in self.notes)])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine, "version_modelled": self.report.version_modelled}
        out["argv" if self.argv is not None else "config"] = list(self.argv) if self.argv is not None else self.config
        out.update(
            pools=[p.to_json() for p in self.report.pools], reported=dict(self.report.reported), notes=list(self.notes)
        )
        return out


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./=:," for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for nested dicts of scalars and lists of scalars."""
    pad = " " * indent
    lines = []
    for key, v in value.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{key}:\n{to_yaml(v, indent + 2)}".rstrip("\n"))
        elif isinstance(v, list | tuple):
            lines.append(f"{pad}{key}: [{', '.join(json.dumps(x) for x in v)}]")
        else:
            lines.append(f"{pad}{key}: {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def _concurrency_note(engine: str, report: EngineReport, plan: PoolPlan) -> str | None:
    ours, theirs = plan.max_concurrency(), report.max_concurrency(plan.avg_seq_len)
    if ours == theirs:
        return None
    parts = [f"{k} {theirs[k]} (plan {ours[k]})" for k in ours if ours[k] is not None]
    return f"at the same memory {engine}'s own split holds other numbers of requests at once: " + ", ".join(parts)


def _common_notes(engine: str, plan: PoolPlan) -> list[str]:
    notes = []
    if plan.constraints:
        notes.append(
            f"{engine} has no page floors: the plan's constraints "
            f"({', '.join(c.name for c in plan.constraints)}) are not enforced by the engine"
        )
    if plan.limits.max_draft_len or plan.limits.num_extra_kv_tokens:
        notes.append(
            f"speculative decoding (draft {plan.limits.max_draft_len}, extra KV "
            f"{plan.limits.num_extra_kv_tokens}) needs the engine's own drafter flags"
        )
    return notes


def layout(plan: PoolPlan, parallel: Parallel | None) -> Parallel:
    """The launch's parallel layout: `parallel` when given, else the plan's (its
    spec's tensor-parallel size and pipeline stages)."""
    if parallel is not None:
        return parallel
    return Parallel(tp=plan.spec.tp_size, pp=plan.spec.pp_stage[1] if plan.spec.pp_stage else 1)


def _vllm_parallel(par: Parallel, notes: list[str]) -> list[str]:
    """vLLM's parallel flags: attention data parallelism is `--data-parallel-size`
    replicas of `--tensor-parallel-size tp / dp` (kvpool's --dp divides --tp, as
    SGLang's does); expert parallelism spans all of them (`--enable-expert-parallel`:
    EP size = DP x TP), so an --ep other than --tp is stated in a note."""
    argv = ["--tensor-parallel-size", str(par.tp // par.dp)]
    if par.pp > 1:
        argv += ["--pipeline-parallel-size", str(par.pp)]
    if par.dp > 1:
        argv += ["--data-parallel-size", str(par.dp)]
    if par.ep > 1:
        argv.append("--enable-expert-parallel")
        if par.ep != par.tp:
            notes.append(f"vLLM's expert parallelism spans all {par.tp} ranks (DP x TP), not --ep {par.ep}")
    return argv


def _vllm_dtype(plan: PoolPlan, notes: list[str]) -> str:
    dt = plan.spec.kv_dtype
    if dt == engine_auto_dtype(plan.spec.config):
        return "auto"
    if dt in ("bf16", "fp8", "nvfp4"):
        return {"bf16": "bfloat16", "fp8": "fp8", "nvfp4": "nvfp4"}[dt]
    notes.append(f"vLLM has no KV dtype {dt} apart from the model dtype: launched with auto")
    return "auto"


def emit_vllm(plan: PoolPlan, model_id: str, parallel: Parallel | None = None) -> Emitted:
    lim, spec = plan.limits, plan.spec
    notes = _common_notes("vLLM", plan)
    par = layout(plan, parallel)
    tpb = spec.tokens_per_block
    block = tpb if tpb in VLLM_BLOCK_SIZES else 16
    if block != tpb:
        notes.append(f"vLLM takes block sizes {VLLM_BLOCK_SIZES}: {tpb} becomes 16")
    argv = [
        "vllm",
        "serve",
        model_id,
        "--kv-cache-memory-bytes",
        str(plan.budget_bytes),
        "--max-model-len",
        str(lim.max_seq_len),
        "--max-num-seqs",
        str(lim.max_batch_size),
        "--max-num-batched-tokens",
        str(lim.max_num_tokens or lim.max_seq_len),
        "--block-size",
        str(block),
        *_vllm_parallel(par, notes),
        "--kv-cache-dtype",
        _vllm_dtype(plan, notes),
        "--compilation-config",
        json.dumps({"cudagraph_capture_sizes": list(lim.graph_batch_sizes)}),
        *(["--mamba-ssm-cache-dtype", spec.ssm_dtype] if spec.ssm_dtype != "auto" else []),
    ]
    report = vllm.allocate(at_max_positions(spec), lim, plan.budget_bytes, block_size=block)
    notes += _vllm_notes(plan, report, block)
    return Emitted("vllm", tuple(argv), None, tuple(notes), report)


def _vllm_notes(plan: PoolPlan, report: EngineReport, block: int) -> list[str]:
    """What vLLM does to the plan: one shared pool, padding layers, a larger block, refusals."""
    notes = []
    if len(plan.spec.groups) > 1:
        shares = ", ".join(f"{g.name} {100 * g.share:.1f}%" for g in plan.groups)
        notes.append(f"vLLM keeps one shared block pool and cannot hold the plan's split ({shares})")
    if report.reported.get("padding_layers"):
        notes.append(
            f"vLLM pads {report.reported['padding_layers']} empty layers into its groups; "
            "their blocks are allocated and never used"
        )
    if report.reported.get("block_size", block) != block:
        notes.append(f"vLLM raises the block size to {report.reported['block_size']} for the state pages")
    notes += [f"vLLM would refuse to start: {r}" for r in report.refusals]
    if (n := _concurrency_note("vLLM", report, plan)) is not None:
        notes.append(n)
    return notes


def _sglang_ratio(full: int, swa: int, page: int) -> str:
    """The shortest decimal r with int(full * r) // page * page == swa."""
    for digits in range(3, 10):
        for r in (round(swa / full, digits), round(swa / full, digits) + 10**-digits):
            if int(full * r) // page * page == swa:
                return f"{r:.{digits}f}"
    return f"{swa / full:.9f}"


def _sglang_parallel(par: Parallel) -> list[str]:
    """SGLang's parallel flags: `--tp` over all ranks of a stage, `--pp-size`,
    `--dp` with `--enable-dp-attention` (attention data parallelism inside the TP
    group, kvpool's --dp), `--ep-size`."""
    argv = ["--tp", str(par.tp)]
    if par.pp > 1:
        argv += ["--pp-size", str(par.pp)]
    if par.dp > 1:
        argv += ["--dp", str(par.dp), "--enable-dp-attention"]
    if par.ep > 1:
        argv += ["--ep-size", str(par.ep)]
    return argv


def emit_sglang(plan: PoolPlan, model_id: str, parallel: Parallel | None = None) -> Emitted:
    lim, spec = plan.limits, plan.spec
    notes = _common_notes("SGLang", plan)
    par = layout(plan, parallel)
    tpb = spec.tokens_per_block
    full, swa, states = _sglang_pools(plan)
    total = min(g.pages for g in full) * tpb
    if len({g.pages for g in full}) > 1:
        notes.append(
            f"SGLang keeps one token count for {', '.join(g.name for g in full)}: "
            f"{total} tokens each (the plan differs by group)"
        )
    kv = _sglang_dtype(spec, notes)
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_id,
        "--context-length",
        str(lim.max_seq_len),
        "--max-total-tokens",
        str(total),
        "--max-running-requests",
        str(lim.max_batch_size),
        "--chunked-prefill-size",
        str(lim.max_num_tokens or -1),
        "--page-size",
        str(tpb),
        *_sglang_parallel(par),
        "--kv-cache-dtype",
        kv,
        SGLANG_GRAPH_FLAG,
        *(str(b) for b in lim.graph_batch_sizes),
    ]
    ratio, slots = sglang.DEFAULT_SWA_FULL_TOKENS_RATIO, None
    if swa:
        text = _sglang_ratio(total, swa[0].pages * tpb, tpb)
        ratio = float(text)
        argv += ["--swa-full-tokens-ratio", text]
    if states:
        slots = states[0].pages
        argv += ["--max-mamba-cache-size", str(slots)]
    notes.append(
        f"SGLang sizes its pools from --mem-fraction-static: leave at least "
        f"{format_bytes(plan.total_bytes)} for them; --max-total-tokens caps the full pool"
    )
    report = sglang.allocate(
        spec,
        lim,
        plan.budget_bytes,
        page_size=tpb,
        swa_full_tokens_ratio=ratio,
        max_running_requests=lim.max_batch_size,
        max_total_tokens=total,
        max_mamba_cache_size=slots,
    )
    return Emitted("sglang", tuple(argv), None, (*notes, *_sglang_notes(plan, report)), report)


def _sglang_notes(plan: PoolPlan, report: EngineReport) -> list[str]:
    """What SGLang needs for the page size, and says of the launch: refusals, requests that fit."""
    tpb = plan.spec.tokens_per_block
    notes = [f"--page-size {tpb} needs an attention backend with paged KV (flashinfer, fa3)"] if tpb > 1 else []
    notes += [f"SGLang would refuse to start: {r}" for r in report.refusals]
    if (n := _concurrency_note("SGLang", report, plan)) is not None:
        notes.append(n)
    return notes


def _sglang_pools(plan: PoolPlan) -> tuple[list[GroupPlan], list[GroupPlan], list[GroupPlan]]:
    """The plan's groups as SGLang's pools: (full, SWA, Mamba state). Without a full
    group every non-state group is SGLang's one pool, and there is no SWA pool."""
    full, states = _of_kinds(plan, "full"), _of_kinds(plan, "state")
    swa = _of_kinds(plan, "sliding", "chunked") if full else []
    return full or [g for g in plan.groups if g not in states], swa, states


def _of_kinds(plan: PoolPlan, *kinds: str) -> list[GroupPlan]:
    return [g for g in plan.groups if g.kind in kinds]


def _sglang_dtype(spec: ModelSpec, notes: list[str]) -> str:
    """SGLang's --kv-cache-dtype for the spec's (auto when it has none: noted)."""
    dt, auto = spec.kv_dtype, engine_auto_dtype(spec.config)
    if dt == auto:
        return "auto"
    kv = {"bf16": "bfloat16", "fp8": "fp8_e4m3", "nvfp4": "nvfp4"}.get(dt)
    if kv is None:
        notes.append(f"SGLang has no KV dtype {dt}: launched with auto")
    return kv or "auto"


def _trtllm_parallel(par: Parallel) -> dict[str, Any]:
    """The LLM API's parallel fields (`TorchLlmArgs`: tensor_parallel_size,
    pipeline_parallel_size, moe_expert_parallel_size, enable_attention_dp)."""
    out: dict[str, Any] = {"tensor_parallel_size": par.tp}
    if par.pp > 1:
        out["pipeline_parallel_size"] = par.pp
    if par.ep > 1:
        out["moe_expert_parallel_size"] = par.ep
    if par.dp > 1:
        out["enable_attention_dp"] = True
    return out


def _trtllm_kv_config(plan: PoolPlan) -> dict[str, Any]:
    """TensorRT-LLM's `kv_cache_config`: the budget, the page size, the dtype and
    how the plan split it (its avg_seq_len, or its shares)."""
    spec, dt = plan.spec, plan.spec.kv_dtype
    kv: dict[str, Any] = {
        "max_gpu_total_bytes": plan.budget_bytes,
        "tokens_per_block": spec.tokens_per_block,
        "dtype": "auto" if dt == engine_auto_dtype(spec.config) else dt,
    }
    if plan.policy == "typical_step" and plan.avg_seq_len is not None:
        kv["avg_seq_len"] = plan.avg_seq_len
    elif plan.policy not in ("reference", "typical_step") and len(plan.groups) > 1:
        kv["pool_ratio"] = {g.name: round(g.share, 6) for g in plan.groups}
    return kv


def emit_trtllm(plan: PoolPlan, model_id: str, parallel: Parallel | None = None) -> Emitted:
    lim, spec = plan.limits, plan.spec
    notes = _common_notes("TensorRT-LLM", plan)
    par = layout(plan, parallel)
    if par.dp > 1 and par.dp != par.tp:
        notes.append(
            f"TensorRT-LLM's attention DP runs one attention rank per GPU (dp = tp {par.tp}), not --dp {par.dp}"
        )
    config = {
        **_trtllm_parallel(par),
        "kv_cache_config": _trtllm_kv_config(plan),
        "max_batch_size": lim.max_batch_size,
        "max_num_tokens": lim.max_num_tokens or lim.max_seq_len,
        "max_seq_len": lim.max_seq_len,
        "cuda_graph_config": {"batch_sizes": list(lim.graph_batch_sizes)},
    }
    if len(spec.groups) > 1:
        v1 = trtllm.allocate(spec, lim, plan.budget_bytes, manager="v1")
        notes.append(
            f"the V1 KV cache manager ignores avg_seq_len / pool_ratio and splits by window "
            f"({', '.join(v1.lines)}); use the V2 manager for this plan"
        )
    report = trtllm.allocate(spec, lim, plan.budget_bytes, manager="v2")
    notes.append(f"serve with: trtllm-serve {model_id} --extra_llm_api_options kvpool.yaml")
    return Emitted("trtllm", None, config, tuple(notes), report)


EMITTERS = {"vllm": emit_vllm, "sglang": emit_sglang, "trtllm": emit_trtllm}


def emit(
    engine: str, plan: PoolPlan, model_id: str, tiers: Sequence[TierPlan] = (), parallel: Parallel | None = None
) -> Emitted:
    """The launch for `engine` (vllm, sglang, trtllm) that follows `plan` on the
    `parallel` layout (default: the plan's TP and PP), with the flags of its cold
    `tiers` per rank (`plan.tiers`), if any."""
    if engine not in EMITTERS:
        raise EngineNotModelledError(f"unknown engine {engine!r}; choose one of {', '.join(EMITTERS)}")
    out = EMITTERS[engine](plan, model_id, parallel)
    return add_tiers(out, plan, tiers) if tiers else out


def add_tiers(emitted: Emitted, plan: PoolPlan, tiers: Sequence[TierPlan]) -> Emitted:
    """`emitted` with each engine's flags for the host tier, and notes where it
    cannot say a tier. vLLM: `--kv-offloading-size` GiB "summed across all TP
    ranks" (vllm/config/cache.py `kv_offloading_size`), so one rank's tier times
    the KV ranks. SGLang HiCache: `--hicache-size` GB, one rank's host pool
    (`HostKVCache(host_size=...)`). TensorRT-LLM: `kv_cache_config.host_cache_size`
    bytes per rank (V2's `HostCacheTierConfig`)."""
    host, disk = (next((t for t in tiers if t.medium == m), None) for m in (Medium.CPU, Medium.DISK))
    config = emitted.config

    if emitted.engine == "vllm":
        more, notes = _vllm_tier_flags(plan, host, disk)
    elif emitted.engine == "sglang":
        more, notes = _sglang_tier_flags(emitted.report, host, disk)
    else:
        more, notes = [], [TRTLLM_NO_DISK] if disk is not None else []
        if config is not None and host is not None:
            config = {**config, "kv_cache_config": {**config["kv_cache_config"], "host_cache_size": host.bytes}}
    argv = None if emitted.argv is None else (*emitted.argv, *more)
    return replace(emitted, argv=argv, config=config, notes=(*emitted.notes, *notes))


TRTLLM_NO_DISK = "TensorRT-LLM's disk tier (DiskCacheTierConfig) is not among the LLM API options"


def _vllm_tier_flags(plan: PoolPlan, host: TierPlan | None, disk: TierPlan | None) -> tuple[list[str], list[str]]:
    """vLLM's flags for the host tier (its size summed over the KV ranks) and notes."""
    argv, notes = [], []
    if host is not None:
        kv_ranks = plan.spec.tp_size * (plan.spec.pp_stage[1] if plan.spec.pp_stage else 1)
        argv += ["--kv-offloading-backend", "native", "--kv-offloading-size", f"{host.bytes * kv_ranks / GiB:g}"]
        if len(plan.groups) > 1:
            kinds = ", ".join(g.kind for g in plan.groups)
            notes.append(f"vLLM's CPU offloading: check that your release offloads this model's {kinds} layers")
    if disk is not None:
        notes.append("vLLM's native offloading has no disk tier (LMCache's max_local_disk_size, per rank, has)")
    return argv, notes


def _sglang_tier_flags(
    report: EngineReport, host: TierPlan | None, disk: TierPlan | None
) -> tuple[list[str], list[str]]:
    """SGLang HiCache's flags for the host tier (GB per rank) and notes."""
    argv, notes = [], []
    if host is not None:
        size = max(1, host.bytes // 10**9)
        argv += ["--enable-hierarchical-cache", "--hicache-size", str(size)]
        if any(p.name == "mamba" for p in report.pools):
            pools = sglang_host_pools(report, size_gb=size)
            notes.append(
                f"SGLang's HiCache shares --hicache-size {size} between its host pools by device bytes: "
                f"{pools.kv_tokens:,} KV tokens and {pools.mamba_slots:,} Mamba state slots; a host hit "
                "needs its prefix's state checkpoint, so the state slots bound the prefixes kept on host"
            )
    if disk is not None:
        notes.append(
            "SGLang HiCache takes no disk size: its third level is a storage backend (--hicache-storage-backend)"
        )
    return argv, notes


def at_max_positions(spec: ModelSpec) -> ModelSpec:
    """`spec` read again at the model's max positions: vLLM sizes a sliding layer
    as sliding whatever max_model_len is, where kvpool's plan (loaded at
    max_seq_len) turns a window >= L into full attention."""
    if not spec.config or not any(g.kind == "full" for g in spec.groups):
        return spec  # nothing was turned into full attention
    pp = spec.pp_stage[1] if spec.pp_stage else 1
    again = load_model_spec(
        dict(spec.config),
        kv_dtype=spec.kv_dtype,
        tp_size=spec.tp_size,
        pp_size=pp,
        tokens_per_block=spec.tokens_per_block,
        ssm_dtype=spec.ssm_dtype,
    )
    # the drafter's groups (spec/drafts.py) come along as they were
    groups = again.groups + spec.draft_groups
    return replace(
        again, name=spec.name, source=spec.source, kv_dtype_note=spec.kv_dtype_note, groups=groups, drafter=spec.drafter
    )
