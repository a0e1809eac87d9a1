"""What each layer of a corpus config caches, read two ways: by kvpool
(`load_model_spec`) and from transformers' own config object built from the same
JSON. Used by tests/test_config_corpus.py; run as a script it rewrites the table
docs/models-corpus.md:

    .venv/bin/python tests/corpus_layers.py

One layer is a sorted tuple of entries `(kind, window, bytes)`: `bytes` is one
stored row of that layer at bf16 and tensor-parallel size 1, `window` the sliding
window, chunk size or compression ratio. Recurrent-state entries are
`("state", None, None)`: their bytes are checked by hand in the family tests.
The transformers side is derived here, independently of kvpool's rules, from the
attributes transformers computes (`layer_types`, `sliding_window`, per-layer
`num_key_value_heads` / `head_dim`, MLA and indexer sizes).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec import load_model_spec

CONFIGS = Path(__file__).parent / "data" / "configs"
TABLE = Path(__file__).parents[1] / "docs" / "models-corpus.md"
BF16 = 2
Entry = tuple[str, int | None, int | None]
Layer = tuple[Entry, ...]

# Files where kvpool deliberately reads a layer otherwise than transformers' object,
# because engines serve it otherwise: file -> why. None today.
EXCEPTIONS: dict[str, str] = {}


def kvpool_layers(path: Path) -> list[Layer]:
    """Per-layer entries of kvpool's spec. A window no request outgrows is full
    attention in kvpool's plans; the corpus compares raw layer kinds, so the
    spec is built for an unbounded sequence length."""
    spec = load_model_spec(path, kv_dtype="bf16", max_seq_len=1 << 40)
    per: list[list[Entry]] = [[] for _ in range(spec.num_layers)]
    for g in spec.groups:
        for i in g.layers:
            if g.rule.per_request:
                per[i].append(("state", None, None))
            else:
                per[i].append((g.kind, g.ratio if g.kind == "compressed" else g.window, g.row_bytes // len(g.layers)))
    return [tuple(sorted(x, key=repr)) for x in per]


def _hf_config(raw: dict[str, Any]) -> Any:
    """transformers' text config object; a wrapper whose own model_type this
    transformers does not know is read through its `text_config` (Kimi-K3)."""
    from transformers import CONFIG_MAPPING

    model_type = str(raw.get("model_type"))
    text = raw.get("text_config")
    if model_type not in CONFIG_MAPPING and isinstance(text, dict) and text.get("model_type") in CONFIG_MAPPING:
        raw, model_type = text, str(text["model_type"])
    if model_type not in CONFIG_MAPPING:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            cfg = CONFIG_MAPPING[model_type](**{k: v for k, v in raw.items() if k != "model_type"})
        finally:
            logging.disable(logging.NOTSET)
    return cfg.get_text_config()


def _layer_cfg(t: Any, i: int) -> Any:
    # transformers 5 keeps per-layer values (Gemma 4's global layers) in per_layer_config
    return t.per_layer_config[i] if getattr(t, "is_heterogeneous", False) else t


def _attention_bytes(c: Any, sliding: bool = False) -> int:
    """K and V rows of one layer: KV heads x (k head size + v head size)."""
    heads = c.num_key_value_heads or c.num_attention_heads
    if sliding and c.model_type == "mimo_v2_flash":
        heads *= 2  # MiMoV2FlashAttention: "SWA layers double the kv heads vs full-attention"
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    v_dim = getattr(c, "v_head_dim", None) or dim
    return int(BF16 * heads * (dim + v_dim))


def _mla_bytes(t: Any) -> int:
    """MLA keeps one latent row per position: kv_lora_rank + the shared RoPE key."""
    return int(BF16 * (t.kv_lora_rank + t.qk_rope_head_dim))


def _indexer_bytes(dim: int) -> int:
    """Sparse-attention indexer key: FP8 values plus one FP32 scale per 128."""
    return dim + 4 * -(-dim // 128)


def _v4_entries(t: Any, kind: str) -> list[Entry]:
    """DeepSeek-V4: every layer keeps its sliding window (MQA, one shared K=V row of
    head_dim); compressed layers add compressed rows, their compressor state and, at
    ratio 4, indexer keys."""
    row = BF16 * t.num_key_value_heads * t.head_dim
    out: list[Entry] = [("sliding", t.sliding_window, row)]
    ratio = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}.get(kind)
    if kind != "sliding_attention" and ratio is None:
        raise ValueError(f"unknown DeepSeek-V4 layer type {kind!r}")
    if ratio:
        out += [("compressed", ratio, row), ("state", None, None)]
    if ratio == 4:
        out.append(("compressed", 4, _indexer_bytes(t.index_head_dim)))
    return out


def _hf_layer(t: Any, i: int, kind: str) -> list[Entry]:
    c = _layer_cfg(t, i)
    if t.model_type == "deepseek_v4":
        return _v4_entries(t, kind)
    if kind in ("full_attention", "attention", "indexed_attention") and getattr(t, "kv_lora_rank", None):
        out: list[Entry] = [("full", None, _mla_bytes(t))]
        if kind == "indexed_attention":
            out.append(("full", None, _indexer_bytes(t.index_head_dim)))
        return out
    if kind in ("full_attention", "attention"):
        return [("full", None, _attention_bytes(c))]
    if kind == "sliding_attention":
        return [("sliding", c.sliding_window, _attention_bytes(c, sliding=True))]
    if kind == "chunked_attention":
        return [("chunked", t.attention_chunk_size, _attention_bytes(c))]
    if kind in ("linear_attention", "mamba"):
        return [("state", None, None)]
    if kind in ("moe", "mlp"):
        return []  # Nemotron-H feed-forward blocks: nothing cached
    raise ValueError(f"layer {i}: layer type {kind!r} has no rule here")


def hf_layer_types(t: Any) -> list[str]:
    """transformers' layer types; configs without `layer_types` (Llama, Mixtral,
    Phi-3, Qwen3-MoE, DeepSeek) use `sliding_window` on every layer when it is
    set (and `use_sliding_window` does not turn it off), else full attention."""
    n = t.num_hidden_layers
    if getattr(t, "layer_types", None):
        return list(t.layer_types)[:n]
    windowed = getattr(t, "sliding_window", None) and getattr(t, "use_sliding_window", True) is not False
    return ["sliding_attention" if windowed else "full_attention"] * n


def hf_layers(raw: dict[str, Any]) -> list[Layer] | None:
    """Per-layer entries from transformers' config object (None when this
    transformers does not know the model_type)."""
    t = _hf_config(raw)
    if t is None:
        return None
    return [tuple(sorted(_hf_layer(t, i, k), key=repr)) for i, k in enumerate(hf_layer_types(t))]


@dataclass(frozen=True)
class Row:
    model: str
    model_type: str
    kvpool: list[Layer]
    hf: list[Layer] | None
    refused: str | None = None  # kvpool's SpecError for a family it cannot model

    @property
    def differing_layers(self) -> list[int]:
        if self.hf is None or self.refused is not None:
            return []
        n = max(len(self.kvpool), len(self.hf))
        pad: list[Layer] = [(("missing", None, None),)] * n
        return [i for i, (a, b) in enumerate(zip(self.kvpool + pad, self.hf + pad, strict=False)) if i < n and a != b]

    @property
    def verdict(self) -> str:
        if self.refused is not None:
            return "refused by kvpool (cannot model it)"
        if self.hf is None:
            return f"skipped: transformers has no {self.model_type}"
        if not self.differing_layers:
            return "agree"
        return "differ (listed exception)" if self.model in EXCEPTIONS else "differ"


def compare(path: Path) -> Row:
    raw = json.loads(path.read_text())
    model_type = str(raw.get("model_type"))
    try:
        layers = kvpool_layers(path)
    except SpecError as e:
        return Row(path.stem, model_type, [], hf_layers(raw), refused=str(e))
    return Row(path.stem, model_type, layers, hf_layers(raw))


def summary(layers: list[Layer], *, with_bytes: bool = False) -> str:
    """`52 sliding(1024) + 10 full`: layers counted by what they cache (with
    `with_bytes`, each entry's bytes per stored row: `10 full:8192`)."""

    def name(layer: Layer) -> str:
        parts = []
        for kind, window, size in layer:
            part = kind if window is None else f"{kind}({window})"
            parts.append(f"{part}:{size}" if with_bytes and size is not None else part)
        return "+".join(sorted(set(parts))) or "none"

    counts = Counter(name(x) for x in layers)
    return " + ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def render(rows: list[Row]) -> str:
    from transformers import __version__

    agree = sum(r.verdict == "agree" for r in rows)
    lines = [
        "# Published configs: kvpool against transformers, layer by layer",
        "",
        f"Generated by `tests/corpus_layers.py` from the {len(rows)} config.json files in tests/data/configs/",
        f"(sources: tests/data/configs/SOURCES.md) with transformers {__version__}; tests/test_config_corpus.py",
        "checks this table is current. Per layer, kvpool's spec and transformers' own config object",
        "(`CONFIG_MAPPING[model_type](**config).get_text_config()`) must give the same kinds, sliding window",
        "(or chunk / compression ratio) and bytes per stored row at bf16 (KV heads x (k + v head size), the",
        "MLA latent, indexer keys); recurrent-state layers must be the same layers.",
        "",
        f"{agree} of {len(rows)} agree.",
        "",
        "Per layer: how many layers cache what, `kind(window or ratio):bytes of one stored row`",
        "(`state`: a recurrent-state slot per request; `none`: a feed-forward block).",
        "",
        "| model | model_type | layers | per layer (kvpool) | kvpool vs transformers |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        layers = len(r.kvpool) if r.refused is None else "-"
        seen = summary(r.kvpool, with_bytes=True) if r.refused is None else "-"
        lines.append(f"| {r.model} | {r.model_type} | {layers} | {seen} | {r.verdict} |")
    if EXCEPTIONS:
        lines += ["", "Listed exceptions:", ""] + [f"- {k}: {v}" for k, v in EXCEPTIONS.items()]
    return "\n".join(lines) + "\n"


def corpus_files() -> list[Path]:
    return sorted(CONFIGS.glob("*.json"), key=lambda p: p.name.lower())


if __name__ == "__main__":
    TABLE.write_text(render([compare(p) for p in corpus_files()]))
    print(f"wrote {TABLE}")
