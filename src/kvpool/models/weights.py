"""Weight bytes of a model, in total and on the busiest rank of a parallel layout.

**Where the bytes come from.** A folder with `*.safetensors` files is read
exactly, from the headers only (`models/safetensors_headers.py`: dtype size x
shape of every tensor, shards through `model.safetensors.index.json`). A Hugging
Face id whose weights are not cached is read the same way remotely, header bytes
only, cached (`models/remote_headers.py`). Otherwise
the bytes are counted from config.json: the parameter formula of the family
(`models/params.py`) times the storage of each tensor under the checkpoint's
`quantization_config` (`models/weight_dtype.py`: bf16/fp16, fp8 with block
scales, nvfp4, mxfp4 experts as gpt-oss ships them, AWQ/GPTQ int4 with group
scales).

**Per rank** (`Parallel`: tp ranks per pipeline stage, pp stages; dp and ep are
ways of using the tp ranks, SGLang's convention: attention runs tensor-parallel
over tp/dp ranks and data-parallel dp ways, routed experts are split over ep
ranks and each expert tp/ep ways). Each tensor, named as in the checkpoint, is one of:

- embeddings and lm_head: vocab-parallel, ceil(bytes / tp); the embeddings on
  the first stage, lm_head (and final norm) on the last; tied embeddings with pp >
  1 are held again as lm_head on the last stage (vLLM loads them there);
- attention q / o (and MLA q_b / kv_b / o, head sinks): ceil(bytes / (tp/dp));
  k and v: kv heads split as the KV cache is (spec/families.py `split_heads`:
  ceil(heads / ranks), a replica of one head when there are fewer heads than ranks);
  MLA's q_a / kv_a projections, their norms and the V3.2 indexer are replicated
  (vLLM builds them as ReplicatedLinear);
- dense and shared-expert MLP: ceil(bytes / tp); routed experts: the busiest
  rank holds ceil(E / ep) of the E experts, each split tp/ep ways;
- routers and norms: replicated on every rank; multi-token-prediction layers
  (layer index >= num_hidden_layers) are not loaded;
- layers are split into pp stages as vLLM does (vllm/distributed/utils.py
  `get_pp_indices`: L // pp each, the L mod pp extra layers on the stages before
  the last); the busiest stage is the answer.

Layer-less tensors other than embeddings, lm_head and the final norm (a vision
tower) are counted on every rank, which can only overstate a rank.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.errors import KvpoolError
from kvpool.models.params import ParameterCountError, matrices, model_type, parameter_count
from kvpool.models.remote_headers import RemoteHeadersError, hub_snapshot, remote_tensors
from kvpool.models.safetensors_headers import TensorHeader, checkpoint_files, checkpoint_tensors
from kvpool.models.weight_dtype import matrix_bytes, weight_scheme
from kvpool.units import is_positive_int

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_REPLICATED_ATTENTION = re.compile(r"\.(q_a_proj|kv_a_proj_with_mqa|q_a_layernorm|kv_a_layernorm|indexer)\.")
_ROUTER = re.compile(r"\.(mlp|block_sparse_moe)\.(gate|router)\.")
_VISION = re.compile(r"(^|\.)(vision_tower|vision_model|visual|multi_modal_projector|vision_embed|embed_vision)\.")
_CONVERTIBLE = ("attention", "kv", "attention_replicated", "mlp", "experts")


def part_of(name: str, num_layers: int) -> tuple[str, int | None]:
    """(part, layer) of a checkpoint tensor name (module docstring); layer None
    for tensors outside the decoder layers."""
    if _VISION.search(name):  # a vision tower's own layers are not decoder layers
        return "replicated", None
    m = _LAYER.search(name)
    layer = int(m.group(1)) if m else None
    if "embed_tokens" in name:
        return "embed", None
    if name.startswith("lm_head") or ".lm_head." in name:
        return "lm_head", None
    if (layer is not None and layer >= num_layers) or name.startswith(("mtp.", "model.mtp.")):
        return "unloaded", layer
    if layer is None:
        return ("final_norm" if re.search(r"(^|\.)(model\.)?norm\.", name) else "replicated"), None
    if re.search(r"\.(self_attn|attn)\.", name):
        if _REPLICATED_ATTENTION.search(name) or re.search(r"\.(q_norm|k_norm)\.", name):
            return "attention_replicated", layer
        return ("kv" if re.search(r"\.(k_proj|v_proj)\.", name) else "attention"), layer
    if _ROUTER.search(name) or "shared_expert_gate" in name:
        return "replicated", layer
    if ".experts." in name and "shared_expert" not in name:
        return "experts", layer
    if re.search(r"\.(mlp|block_sparse_moe|feed_forward)\.", name):
        return "mlp", layer
    return "replicated", layer


@dataclass(frozen=True)
class Parallel:
    """A parallel layout: tp ranks per stage, pp stages; dp (data-parallel
    attention) and ep (expert parallel) must divide tp."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "ep", "dp"):
            if not is_positive_int(getattr(self, key)):
                raise KvpoolError(f"--{key} must be a positive integer, got {getattr(self, key)}")
        for key in ("ep", "dp"):
            if self.tp % getattr(self, key):
                raise KvpoolError(f"--{key} {getattr(self, key)} must divide --tp {self.tp}")


@dataclass(frozen=True)
class WeightTensor:
    """One checkpoint tensor (or several identical ones): its part, layer and bytes."""

    name: str
    part: str
    layer: int | None
    nbytes: int


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """The decoder layers of each pipeline stage, as vLLM's `get_pp_indices` splits them."""
    if pp > num_layers:
        raise KvpoolError(f"--pp {pp} is more stages than the model's {num_layers} layers")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:s]) for s in range(pp)]
    return [range(b, b + n) for b, n in zip(starts, sizes, strict=True)]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelWeights:
    """A model's weight tensors and what the per-rank split needs to know."""

    tensors: tuple[WeightTensor, ...]
    num_layers: int
    kv_heads: int
    num_experts: int
    tied: bool
    parameters: int | None
    source: str

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor an engine loads (multi-token-prediction layers excluded)."""
        return sum(t.nbytes for t in self.tensors if t.part != "unloaded")

    def share(self, t: WeightTensor, par: Parallel) -> int:
        """Bytes of tensor `t` on one rank of its stage under `par`."""
        attn_tp = par.tp // par.dp
        if t.part in ("embed", "lm_head", "mlp"):
            return _ceil_div(t.nbytes, par.tp)
        if t.part == "attention":
            return _ceil_div(t.nbytes, attn_tp)
        if t.part == "kv":
            heads = max(1, _ceil_div(self.kv_heads, attn_tp))
            return _ceil_div(t.nbytes * heads, self.kv_heads)
        if t.part == "experts":
            e = max(1, self.num_experts)
            return _ceil_div(t.nbytes * _ceil_div(e, par.ep) * par.ep, e * par.tp)
        return 0 if t.part == "unloaded" else t.nbytes

    def stage_bytes(self, par: Parallel) -> list[int]:
        """Bytes on one rank of each pipeline stage (all tp ranks of a stage hold the same)."""
        stages = stage_layers(self.num_layers, par.pp)
        first_of = {i: s for s, r in enumerate(stages) for i in r}
        out = [0] * par.pp
        for t in self.tensors:
            b = self.share(t, par)
            if t.part == "embed":
                out[0] += b
                if self.tied and par.pp > 1:
                    out[-1] += b
            elif t.part in ("lm_head", "final_norm"):
                out[-1] += b
            elif t.layer is None:
                out = [o + b for o in out]
            else:
                out[first_of.get(t.layer, par.pp - 1)] += b
        return out

    def with_draft_layers(self, count: int) -> ModelWeights:
        """These weights with the first `count` multi-token-prediction layers loaded,
        as engines do when those layers draft tokens (vLLM's deepseek_mtp / SGLang's
        EAGLE with MTP): a layer past the decoder's joins the last pipeline stage and is
        split like a decoder layer. Checkpoints name them `model.layers.{L+i}` (DeepSeek)
        or `mtp.*` (Qwen3-Next, MiMo); a formula-counted model has none to add."""
        if count < 1:
            return self
        tensors = []
        for t in self.tensors:
            if t.part == "unloaded":
                inner = re.sub(r"^(model\.)?mtp\.", "model.", t.name)
                part, layer = part_of(inner, self.num_layers + count)
                if part != "unloaded":
                    # mtp.* layers count from 0: place them past the decoder (the last stage)
                    t = WeightTensor(
                        t.name, part, self.num_layers + (layer or 0) if inner != t.name else layer, t.nbytes
                    )
            tensors.append(t)
        loaded = dataclasses.replace(self, tensors=tuple(tensors))
        if loaded.total_bytes == self.total_bytes:
            return dataclasses.replace(
                self, source=f"{self.source}; its MTP layers are not counted (none in the weights read)"
            )
        return dataclasses.replace(loaded, source=f"{self.source} + {count} MTP layer(s) for drafting")

    def per_rank_bytes(self, par: Parallel) -> int:
        """Weight bytes of the busiest rank under `par` (tp = pp = 1: the total)."""
        return max(self.stage_bytes(par))


def _counts(config: Mapping[str, Any]) -> tuple[int, int, int]:
    layers = int(config.get("num_hidden_layers") or 0)
    if layers < 1:
        raise ParameterCountError("config is missing field 'num_hidden_layers', which the weights need")
    heads = int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 1)
    experts = int(config.get("n_routed_experts") or config.get("num_local_experts") or config.get("num_experts") or 0)
    return layers, heads, experts


def weights_from_config(config: Mapping[str, Any]) -> ModelWeights:
    """Weights counted from config.json (module docstring). Raises
    UnknownFamilyError (a KvpoolError) for a family without a formula."""
    scheme, layers = weight_scheme(config), _counts(config)
    family = model_type(config)
    tensors = []
    for m in matrices(config):
        part, layer = part_of(m.name, layers[0])
        module = m.name.rsplit(".", 1)[0] if m.name.endswith((".weight", ".bias")) else m.name
        convertible = (
            m.cols > 1
            and part in _CONVERTIBLE
            and not scheme.skips(module)
            and (part == "experts" or not scheme.experts_only)
        )
        tensors.append(
            WeightTensor(m.name, part, layer, m.count * matrix_bytes(scheme, m.rows, m.cols, convertible=convertible))
        )
    tied = not any(t.part == "lm_head" for t in tensors)
    note = f"{scheme.kind} weights" if scheme.kind != "none" else "2 bytes per parameter"
    return ModelWeights(tuple(tensors), *layers, tied, parameter_count(config), f"config.json ({family}, {note})")


def weights_from_folder(folder: Path, config: Mapping[str, Any]) -> ModelWeights:
    """Exact weights from the safetensors headers in `folder`; `config` gives the
    layer, KV-head and expert counts. Raises WeightsError for a corrupt header."""
    files = len(checkpoint_files(folder))
    return weights_from_tensors(checkpoint_tensors(folder), config, f"safetensors headers ({files} files in {folder})")


def model_weights(config: Mapping[str, Any], source: str | Path | None = None) -> ModelWeights:
    """The weights of the model `source` names: exact from safetensors headers
    when `source` is a folder (or a file in one) holding them, else counted from
    `config`. Reads only file headers; raises KvpoolError when neither works."""
    if source is not None:
        path = Path(source)
        folder = path if path.is_dir() else path.parent if path.is_file() else None
        if folder is not None and checkpoint_files(folder):
            return weights_from_folder(folder, config)
        snapshot = None if folder is None else hub_snapshot(folder)
        if snapshot is not None:  # a hub id whose weights are not cached: their headers, remotely
            try:
                remote = remote_tensors(*snapshot)
            except RemoteHeadersError:
                pass
            else:
                where = f"safetensors headers of {snapshot[0]}@{snapshot[1][:12]} (remote, header bytes only)"
                return weights_from_tensors(remote, config, where)
    return weights_from_config(config)


def weights_from_tensors(headers: list[TensorHeader], config: Mapping[str, Any], where: str) -> ModelWeights:
    """Exact weights from a checkpoint's tensor headers, wherever they were read."""
    layers = _counts(config)
    tensors = tuple(WeightTensor(t.name, *part_of(t.name, layers[0]), t.nbytes) for t in headers)
    tied = not any(t.part == "lm_head" for t in tensors)
    try:
        params: int | None = parameter_count(config)
    except KvpoolError:
        params = None
    return ModelWeights(tensors, *layers, tied, params, where)
