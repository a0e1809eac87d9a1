"""The typed request of the planning commands: what the options ask for, as frozen
values, read from argparse once at the top of a command (`PlanRequest.from_args`).

Nothing below a command's `run` sees the argparse `Namespace`: the model options,
the budget options and the serving limits travel as these values, and
`plan_args.resolve` turns a request into the resolved model spec, limits and
budget, reading the model's config once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvpool.errors import KvpoolError
from kvpool.models.weights import Parallel
from kvpool.plan.families import Phase

# The whole-GPU parts a user may give instead of kvpool's estimates, by option name.
PARTS = ("weights_memory", "activation_memory", "cuda_graph_memory", "reserved_memory")


def flag(name: str) -> str:
    """`weights_memory` -> `--weights-memory`."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class ModelOptions:
    """MODEL and the options that shape its KV spec and its weights per rank."""

    model: str
    kv_dtype: str = "auto"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    tokens_per_block: int | None = None
    draft_model: str | None = None  # a drafter's model (or `mtp`): its layers as the spec's draft groups
    ssm_dtype: str = "auto"  # the Mamba SSM state's dtype (vLLM's --mamba-ssm-cache-dtype)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelOptions:
        return cls(
            args.model,
            args.kv_dtype,
            args.tp,
            args.pp,
            args.ep,
            args.dp,
            args.tokens_per_block,
            getattr(args, "draft_model", None),
            getattr(args, "mamba_ssm_dtype", "auto"),
        )

    @property
    def parallel(self) -> Parallel:
        """The --tp / --pp / --ep / --dp layout the weights are split by."""
        return Parallel(tp=self.tp, pp=self.pp, ep=self.ep, dp=self.dp)

    @property
    def attention_tp(self) -> int:
        """Ranks one attention layer (and its KV) is split over: --tp, or --tp / --dp
        with data-parallel attention (SGLang's convention: --dp must divide --tp)."""
        for name, value in (("dp", self.dp), ("ep", self.ep)):
            if self.tp % value:
                raise KvpoolError(f"--{name} {value} must divide --tp {self.tp}")
        return self.tp // self.dp

    def layout(self) -> str:
        """`tp 2` or `tp 4, pp 2`: the sizes beyond 1 (tp always)."""
        sizes = {"tp": self.tp, "pp": self.pp, "ep": self.ep, "dp": self.dp}
        return ", ".join(f"{k} {v}" for k, v in sizes.items() if k == "tp" or v > 1)


@dataclass(frozen=True)
class BudgetOptions:
    """The KV budget options (cli/budget.py reads them): `parts` holds the whole-GPU
    parts given by hand, as (option name, text) pairs in `PARTS` order."""

    kv_memory: str | None = None
    gpu: str | None = None
    non_kv_memory: str | None = None
    memory_fraction: float | None = None
    parts: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BudgetOptions:
        parts = tuple((p, text) for p in PARTS if (text := getattr(args, p, None)) is not None)
        return cls(args.kv_memory, args.gpu, args.non_kv_memory, args.memory_fraction, parts)


@dataclass(frozen=True)
class LimitOptions:
    """The serving-limit options as given; `max_seq_len` None means the model's
    positions capped at the default (resolved with the config)."""

    max_batch_size: int
    max_seq_len: int | None
    max_num_tokens: int | None
    draft_len: int = 0
    extra_kv_tokens: int = 0
    avg_seq_len: int | None = None
    cuda_graph_batch_sizes: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LimitOptions:
        return cls(
            args.max_batch_size,
            args.max_seq_len,
            args.max_num_tokens,
            args.draft_len,
            args.extra_kv_tokens,
            args.avg_seq_len,
            args.cuda_graph_batch_sizes,
        )


@dataclass(frozen=True)
class PlanRequest:
    """Everything `kvpool plan | warmup | simulate | fit` ask of the planner."""

    model: ModelOptions
    budget: BudgetOptions
    limits: LimitOptions
    pool_ratio: str | None = None
    workload: str | None = None
    fit: bool = False
    phase: Phase = "final"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PlanRequest:
        return cls(
            ModelOptions.from_args(args),
            BudgetOptions.from_args(args),
            LimitOptions.from_args(args),
            args.pool_ratio,
            getattr(args, "workload", None),
            args.fit,
            args.phase,
        )
