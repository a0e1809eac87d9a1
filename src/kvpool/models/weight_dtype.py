"""Bytes of one weight tensor as a checkpoint's `quantization_config` stores it.

Tensors a scheme does not convert (embeddings, lm_head, routers, norms, biases,
and the modules it lists in `modules_to_not_convert` / `ignore` /
`exclude_modules`) are 2 bytes per value: bf16 / fp16 as released, and float32
checkpoints are served downcast to bf16 (vLLM `--dtype auto`). A converted
matrix of r x c values costs:

- **fp8** (`quant_method: fp8`, DeepSeek-V3): r*c bytes + one float32 scale per
  `weight_block_size` block, 4 * ceil(r/br) * ceil(c/bc); without blocks one
  float32 scale per tensor (4 bytes);
- **compressed-tensors / ModelOpt** `config_groups` weights of 8-bit float: as
  fp8 per tensor; of 4-bit float with group 16 (**nvfp4**): r*c/2 + r*c/16 (one
  fp8 scale per 16 values) + 8 (float32 global and input scales); of 4-bit int
  with `group_size` g: as AWQ below, symmetric (no zero points);
- **mxfp4** (gpt-oss): only the routed experts are converted (transformers'
  Mxfp4HfQuantizer replaces the experts modules; the config lists the rest in
  `modules_to_not_convert`): r*c/2 + r*c/32 (one E8M0 scale per 32 values);
- **awq / gptq** with `bits` b and `group_size` g (-1: one group per column):
  r*c*b/8 + per group of g inputs and each output a 2-byte scale and a b-bit
  zero point: ceil(c/g)*r*(2 + b/8); gptq with `desc_act` adds a 4-byte g_idx
  per input.

A scheme kvpool cannot size is refused by name rather than counted at 2 bytes.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.errors import KvpoolError

UNCONVERTED_BYTES = 2


class WeightSchemeError(KvpoolError):
    """A quantization_config whose weight storage kvpool cannot size."""


@dataclass(frozen=True)
class WeightScheme:
    """How converted matrices are stored: `kind` (none, fp8, fp8_block, nvfp4,
    mxfp4, int), bits and group of int schemes, and the modules left alone."""

    kind: str = "none"
    bits: int = 16
    group_size: int = -1
    block: tuple[int, int] = (0, 0)
    zero_points: bool = False
    g_idx: bool = False
    experts_only: bool = False
    skip: tuple[str, ...] = ()

    def skips(self, module: str) -> bool:
        """Whether `module` (a tensor name without its last part) is left unconverted."""
        for pat in self.skip:
            pat = pat.removeprefix("re:")
            if module == pat or fnmatch.fnmatch(module, pat) or fnmatch.fnmatch(module, pat + ".*"):
                return True
            if "." not in pat and module.split(".")[-1] == pat:
                return True
        return False


def _skip_list(q: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for key in ("modules_to_not_convert", "ignore", "exclude_modules"):
        value = q.get(key) or []
        if isinstance(value, Sequence) and not isinstance(value, str):
            out += [str(v) for v in value]
    return tuple(out)


def _group_scheme(q: Mapping[str, Any]) -> WeightScheme:
    kinds = _group_kinds(q["config_groups"])
    if len(kinds) != 1:
        raise WeightSchemeError(
            f"weights of quantization config_groups {sorted(map(str, kinds))}: kvpool sizes one scheme"
        )
    bits, kind, group = kinds.pop()
    skip = _skip_list(q)
    if (bits, kind) == (8, "float"):
        return WeightScheme("fp8", 8, skip=skip)
    if (bits, kind, group) == (4, "float", 16):
        return WeightScheme("nvfp4", 4, 16, skip=skip)
    if bits in (2, 3, 4, 8) and kind == "int" and group:
        return WeightScheme("int", int(bits), int(group), skip=skip)
    raise WeightSchemeError(f"weight quantization {bits}-bit {kind} group {group}: kvpool cannot size it")


def _group_kinds(groups: Mapping[str, Any]) -> set[tuple[Any, Any, Any]]:
    """(num_bits, type, group_size) of each config group's weights."""
    weights = [g.get("weights") for g in groups.values() if isinstance(g, Mapping)]
    return {(w.get("num_bits"), w.get("type"), w.get("group_size")) for w in weights if isinstance(w, Mapping)}


def weight_scheme(config: Mapping[str, Any]) -> WeightScheme:
    """The weight storage `config`'s quantization_config declares (module docstring).
    Raises KvpoolError for a method kvpool cannot size."""
    q = config.get("quantization_config")
    if not isinstance(q, Mapping) or not q:
        return WeightScheme()
    method = str(q.get("quant_method") or "").lower()
    algo = str(q.get("quant_algo") or (q.get("quantization") or {}).get("quant_algo") or "").upper()
    if isinstance(q.get("config_groups"), Mapping):
        return _group_scheme(q)
    if method == "fp8":
        block = q.get("weight_block_size")
        if block:
            return WeightScheme("fp8_block", 8, block=(int(block[0]), int(block[1])), skip=_skip_list(q))
        return WeightScheme("fp8", 8, skip=_skip_list(q))
    if method == "mxfp4":
        return WeightScheme("mxfp4", 4, 32, experts_only=True, skip=_skip_list(q))
    if method in ("awq", "gptq"):
        bits, group = int(q.get("bits") or q.get("w_bit") or 4), int(q.get("group_size") or q.get("q_group_size") or -1)
        return WeightScheme("int", bits, group, zero_points=True, g_idx=bool(q.get("desc_act")), skip=_skip_list(q))
    if algo in ("FP8", "NVFP4"):
        skip = _skip_list(q) + _skip_list(q.get("quantization") or {})
        return WeightScheme("fp8", 8, skip=skip) if algo == "FP8" else WeightScheme("nvfp4", 4, 16, skip=skip)
    raise WeightSchemeError(f"weight quantization {method or algo or q!r}: kvpool cannot size it; give --non-kv-memory")


def matrix_bytes(scheme: WeightScheme, rows: int, cols: int, *, convertible: bool) -> int:
    """Stored bytes of one rows x cols tensor; `convertible`: a Linear weight the
    scheme may convert (a matrix of a linear layer, not an embedding or a norm)."""
    n = rows * cols
    if scheme.kind == "none" or not convertible:
        return UNCONVERTED_BYTES * n
    if scheme.kind == "fp8_block":
        br, bc = scheme.block
        return n + 4 * math.ceil(rows / br) * math.ceil(cols / bc)
    if scheme.kind == "fp8":
        return n + 4
    if scheme.kind == "nvfp4":
        return n // 2 + math.ceil(n / 16) + 8
    if scheme.kind == "mxfp4":
        return n // 2 + math.ceil(n / 32)
    group = cols if scheme.group_size <= 0 else scheme.group_size
    groups = math.ceil(cols / group) * rows
    zeros = math.ceil(groups * scheme.bits / 8) if scheme.zero_points else 0
    return math.ceil(n * scheme.bits / 8) + 2 * groups + zeros + (4 * cols if scheme.g_idx else 0)
