"""What a deployment asks of the planner, as frozen values: the model and its
parallel layout, the KV budget per rank, the serving limits and the sizing policy.

`fit`, `plan` and `simulate` (this package) take these as keyword arguments
(`PlanKeywords`, one list for all three) and build one `PlanRequest` with
`PlanRequest.of`; the CLI reads its options into the same keywords. Errors name
the option as the command line spells it (`--max-seq-len` for `max_seq_len`), so
that a shell user and a notebook read the same line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from kvpool.deploy.gpus import split_gpu
from kvpool.errors import KvpoolError, LimitsError
from kvpool.plan.families import Phase
from kvpool.plan.sizing import parse_shares

if TYPE_CHECKING:  # loaded where a layout is built (`ModelOptions.parallel`)
    from kvpool.models.weights import Parallel

DEFAULT_MAX_BATCH_SIZE = 256
DEFAULT_MAX_SEQ_LEN = 8192
DEFAULT_MAX_NUM_TOKENS = 8192
# The whole-GPU parts a user may give instead of kvpool's estimates, by keyword.
PARTS = ("weights_memory", "activation_memory", "cuda_graph_memory", "reserved_memory")

Size = int | str  # bytes, or text such as "40GiB" (units.parse_size)
T = TypeVar("T")


def flag(name: str) -> str:
    """`weights_memory` -> `--weights-memory`."""
    return "--" + name.replace("_", "-")


class PlanKeywords(TypedDict, total=False):
    """The keywords `fit`, `plan` and `simulate` share (each optional; defaults
    as `kvpool plan --help` lists them). Sizes are bytes or text ("40GiB")."""

    # the model's spec and weights per rank
    kv_dtype: str
    tp: int
    pp: int
    ep: int
    dp: int
    tokens_per_block: int | None
    draft_model: str | None
    mamba_ssm_dtype: str
    # the KV budget per rank (beside `gpu`, which each function takes itself)
    kv_memory: Size | None
    non_kv_memory: Size | None
    memory_fraction: float | None
    weights_memory: Size | None
    activation_memory: Size | None
    cuda_graph_memory: Size | None
    reserved_memory: Size | None
    # serving limits
    max_batch_size: int
    max_seq_len: int | None
    max_num_tokens: int | None
    draft_len: int
    extra_kv_tokens: int
    avg_seq_len: int | None
    cuda_graph_batch_sizes: Sequence[int] | None
    # sizing policy
    pool_ratio: Mapping[str, float] | str | None
    workload: str | None
    shrink_to_fit: bool
    phase: Phase


KEYWORDS = frozenset(PlanKeywords.__optional_keys__)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KvpoolError(f"{flag(name)} must be a positive integer, got {value!r}")
    return value


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
    mamba_ssm_dtype: str = "auto"  # the Mamba SSM state's dtype (vLLM's --mamba-ssm-cache-dtype)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):  # an empty one is the model resolver's to explain
            raise KvpoolError(f"MODEL must be a preset name, a path or a Hugging Face id, got {self.model!r}")
        for name in ("tp", "pp", "ep", "dp"):
            _count(name, getattr(self, name))

    @property
    def parallel(self) -> Parallel:
        """The --tp / --pp / --ep / --dp layout the weights are split by."""
        from kvpool.models.weights import Parallel  # here: most runs read no weights' layout

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
    """The KV budget options (deploy/budget.py reads them), sizes as given: `gpu`
    the preset's name without a count; `parts` the whole-GPU parts given by hand,
    as (keyword, text) pairs in `PARTS` order."""

    kv_memory: str | None = None
    gpu: str | None = None
    non_kv_memory: str | None = None
    memory_fraction: float | None = None
    parts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LimitOptions:
    """The serving-limit options as given; `max_seq_len` None means the model's
    positions capped at the default (resolved with the config)."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_seq_len: int | None = None
    max_num_tokens: int | None = DEFAULT_MAX_NUM_TOKENS
    draft_len: int = 0
    extra_kv_tokens: int = 0
    avg_seq_len: int | None = None
    cuda_graph_batch_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.cuda_graph_batch_sizes is not None:  # a list from a caller: kept as a tuple
            object.__setattr__(self, "cuda_graph_batch_sizes", tuple(self.cuda_graph_batch_sizes))


def _size(value: Size | None) -> str | None:
    return None if value is None else str(value)


def _picked(cls: type[T], options: Mapping[str, Any], **given: Any) -> T:
    """`cls` from the keywords among `options` that name its fields (and `given`)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in options.items() if k in names and k not in given}, **given)


def _pool_ratio(ratio: Mapping[str, float] | str | None) -> dict[str, float] | None:
    """`full=0.3,sliding=0.7` or a mapping, as a dict (checked against the spec later)."""
    if not isinstance(ratio, str):
        return None if ratio is None else dict(ratio)
    try:
        return parse_shares(ratio)
    except KvpoolError as e:
        raise LimitsError(f"--pool-ratio: {e}") from None


def layout_of(count: int | None, tp: int, pp: int) -> tuple[int, int]:
    """(tp, GPUs) of `count` GPUs (None: one engine's tp x pp, no count given): N
    GPUs become tensor parallelism unless tp or pp say otherwise. KvpoolError when
    tp x pp does not divide them."""
    if count is not None and count > 1 and tp == pp == 1:
        tp = count  # N GPUs: one engine over all of them
    count = tp * pp if count is None else count
    if count % (tp * pp):
        raise KvpoolError(f"--tp {tp} x --pp {pp} does not divide {count} GPUs")
    return tp, count


@dataclass(frozen=True)
class PlanRequest:
    """Everything `plan`, `fit` and `simulate` ask of the planner (`count`: the
    GPUs of `--gpu NAMExN`, already turned into the layout; tp x pp without one)."""

    model: ModelOptions
    budget: BudgetOptions
    limits: LimitOptions
    pool_ratio: Mapping[str, float] | None = None
    workload: str | None = None
    shrink_to_fit: bool = False
    phase: Phase = "final"
    count: int = 1

    @classmethod
    def of(cls, model: str, gpu: str | None = None, *, whole_gpus: bool = False, **options: Any) -> PlanRequest:
        """The request of `model` on `gpu` (a preset, `NAMExN` for N of them, or
        `auto`: this machine's) with the `PlanKeywords` given. N GPUs become tensor
        parallelism unless tp / pp say otherwise; the GPUs left over are replicas.
        `whole_gpus`: a preset without a count is one GPU (`fit`), not one rank's.
        Raises KvpoolError for an unknown keyword or a layout that does not divide N."""
        unknown = sorted(set(options) - KEYWORDS)
        if unknown:
            raise KvpoolError(f"unknown option(s) {', '.join(unknown)}; the options: {', '.join(sorted(KEYWORDS))}")
        name, count = split_gpu(gpu) if gpu is not None else (None, None)
        model_options = _picked(ModelOptions, options, model=model)  # checks tp and pp
        tp, count = layout_of(1 if count is None and whole_gpus else count, model_options.tp, model_options.pp)
        parts = tuple((p, str(options[p])) for p in PARTS if options.get(p) is not None)
        sizes = {k: _size(options.get(k)) for k in ("kv_memory", "non_kv_memory")}
        return cls(
            dataclasses.replace(model_options, tp=tp),
            _picked(BudgetOptions, options, **sizes, gpu=name, parts=parts),
            _picked(LimitOptions, options),
            _pool_ratio(options.get("pool_ratio")),
            options.get("workload"),
            bool(options.get("shrink_to_fit", False)),
            options.get("phase", "final"),
            count,
        )

    @property
    def replicas(self) -> int:
        """Data-parallel copies of one tp x pp engine on the `count` GPUs."""
        return self.count // (self.model.tp * self.model.pp)

    def with_layout(self, tp: int, pp: int) -> PlanRequest:
        """The same request on one engine of tp x pp GPUs (ep and dp 1)."""
        model = dataclasses.replace(self.model, tp=tp, pp=pp, ep=1, dp=1)
        return dataclasses.replace(self, model=model, count=tp * pp)
