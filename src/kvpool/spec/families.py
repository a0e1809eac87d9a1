"""Per-family rules: what each layer of a Hugging Face config stores.

Each rule turns a config into one `LayerCache` per stored tensor kind and layer;
`loader.build_groups` then merges layers with the same life cycle and bytes into
pool groups. The byte rule of each family is written where it is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpool.errors import SpecError
from kvpool.spec.dtypes import fp8_with_block_scales, row_bytes, served_dtype
from kvpool.spec.groups import Kind

Config = Mapping[str, Any]


@dataclass(frozen=True)
class LayerCache:
    """One layer's share of one pool group: `row_bytes` per stored row (or
    `state_bytes` per request); `tag` names the group it belongs to. `buffers`
    splits the layer's bytes into the tensors an engine keeps apart (a Mamba
    layer's conv and SSM state), empty when the layer is one buffer or K and V."""

    tag: str
    kind: Kind
    layer: int
    row_bytes: int = 0
    state_bytes: int = 0
    window: int | None = None
    ratio: int | None = None
    buffers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Context:
    """What every family rule needs besides the config."""

    kv_dtype: str
    tp_size: int
    max_seq_len: int | None
    # the recurrent (SSM) state's dtype: None = the family's default (the served
    # dtype; Nemotron-H's config field); vLLM's --mamba-ssm-cache-dtype
    ssm_dtype: str | None = None


def need(config: Config, key: str) -> Any:
    """`config[key]`, or a SpecError that names the missing field."""
    if config.get(key) is None:
        raise SpecError(f"config is missing field {key!r}, which this model family needs")
    return config[key]


def split_heads(heads: int, tp_size: int) -> int:
    """Heads per tensor-parallel rank: ceil(heads / tp), at least one. With fewer
    KV heads than ranks each rank keeps a replica of one head."""
    return max(1, -(-heads // tp_size))


def head_dim(config: Config) -> int:
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(need(config, "hidden_size")) // int(need(config, "num_attention_heads"))


def kv_heads(config: Config) -> int:
    return int(config.get("num_key_value_heads") or need(config, "num_attention_heads"))


def attention_kv(heads: int, dim: int, ctx: Context) -> int:
    """Bytes per position per layer of ordinary MHA/GQA/MQA: K and V, each
    `heads_per_rank x head_dim` values in the KV dtype."""
    return 2 * row_bytes(split_heads(heads, ctx.tp_size) * dim, ctx.kv_dtype)


# --------------------------------------------------------------------------- attention


def listed_types(config: Config, n: int) -> list[str] | None:
    """The config's own `layer_types` (one per layer; extra entries ignored)."""
    if not config.get("layer_types"):
        return None
    types = [str(t) for t in config["layer_types"]]
    if len(types) < n:
        raise SpecError(f"layer_types has {len(types)} entries for {n} layers")
    return types[:n]


def interval_types(config: Config, n: int) -> list[str] | None:
    """Qwen3-Next: every `full_attention_interval`-th layer is full attention, the rest linear."""
    if not config.get("full_attention_interval"):
        return None
    k = int(config["full_attention_interval"])
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]


def letter_pattern_types(config: Config, n: int) -> list[str] | None:
    """EXAONE 4: `sliding_window_pattern` letters repeated from layer 0, L local
    and G global, and the last layer global (transformers Exaone4Config)."""
    letters = config.get("sliding_window_pattern")
    if not isinstance(letters, str) or not config.get("sliding_window"):
        return None
    local = [letters[i % len(letters)] == "L" and i < n - 1 for i in range(n)]
    return ["sliding_attention" if is_local else "full_attention" for is_local in local]


def every_pth_global_types(config: Config, n: int) -> list[str] | None:
    """Gemma 3 style: every `sliding_window_pattern`-th layer is global."""
    if not (config.get("sliding_window_pattern") and config.get("sliding_window")):
        return None
    p = int(config["sliding_window_pattern"])
    return ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n)]


def chunked_types(config: Config, n: int) -> list[str] | None:
    """Llama 4: layers with RoPE use chunked local attention, NoPE layers are global
    (`no_rope_layers`, else every `no_rope_layer_interval`-th layer is NoPE)."""
    if not config.get("attention_chunk_size"):
        return None
    rope = config.get("no_rope_layers") or [
        int((i + 1) % int(config.get("no_rope_layer_interval", 4)) != 0) for i in range(n)
    ]
    if len(rope) < n:
        raise SpecError(f"no_rope_layers has {len(rope)} entries for {n} layers")
    return ["chunked_attention" if rope[i] else "full_attention" for i in range(n)]


def windowless_types(config: Config, n: int) -> list[str] | None:
    """No window (none given, or `use_sliding_window: false`): every layer full."""
    if config.get("use_sliding_window") is False or not config.get("sliding_window"):
        return ["full_attention"] * n
    return None


def alternating_types(config: Config, n: int) -> list[str] | None:
    """Gemma 2, whose released config has no layer_types: transformers
    alternates, even layers sliding and odd layers global."""
    if config.get("model_type") != "gemma2" and config.get("cache_implementation") != "hybrid":
        return None
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]


def max_window_layers_types(config: Config, n: int) -> list[str] | None:
    """Qwen2/3 style: the layers from `max_window_layers` on use the window."""
    if "max_window_layers" not in config or not config.get("use_sliding_window"):
        return None
    m = int(config["max_window_layers"])
    return ["sliding_attention" if i >= m else "full_attention" for i in range(n)]


# The conventions a config may follow, the most explicit first; none: Mistral's
# one window on every layer.
LAYER_TYPE_RULES = (
    listed_types,
    interval_types,
    letter_pattern_types,
    every_pth_global_types,
    chunked_types,
    windowless_types,
    alternating_types,
    max_window_layers_types,
)


def layer_types(config: Config) -> list[str]:
    """Per-layer attention type, from the most explicit field the config has."""
    n = int(need(config, "num_hidden_layers"))
    for rule in LAYER_TYPE_RULES:
        types = rule(config, n)
        if types is not None:
            return types
    return ["sliding_attention"] * n  # Mistral style: one window on every layer


def global_kv(config: Config, ctx: Context, heads: int, dim: int) -> int:
    """A global layer's KV bytes per token. Gemma 4's have their own heads and size
    (2 x 512 instead of 8 x 256); with attention_k_eq_v the V projection is shared
    with K, but K is normalised and rotated and V is not, so both are cached."""
    if config.get("global_head_dim") or config.get("num_global_key_value_heads"):
        heads = int(config.get("num_global_key_value_heads") or heads)
        dim = int(config.get("global_head_dim") or dim)
    return attention_kv(heads, dim, ctx)


def sliding_layer(config: Config, ctx: Context, i: int, kv: int) -> LayerCache:
    """Sliding-window layer `i`; a window no request can outgrow is full attention."""
    w = int(need(config, "sliding_window"))
    if ctx.max_seq_len is not None and w >= ctx.max_seq_len:
        return LayerCache("full", "full", i, kv)
    return LayerCache("sliding", "sliding", i, kv, window=w)


def standard_attention(config: Config, ctx: Context, *, linear_ok: bool = False) -> list[LayerCache]:
    """Full, sliding and chunked attention layers, including Gemma 4's global
    layers that have their own KV head count and head size. Linear-attention
    layers are left to `gated_deltanet` (`linear_ok`), never silently dropped."""
    heads, dim = kv_heads(config), head_dim(config)
    out = []
    for i, t in enumerate(layer_types(config)):
        if t in ("full_attention", "global_attention", "attention"):
            out.append(LayerCache("full", "full", i, global_kv(config, ctx, heads, dim)))
        elif t == "sliding_attention":
            out.append(sliding_layer(config, ctx, i, attention_kv(heads, dim, ctx)))
        elif t == "chunked_attention":
            c = int(need(config, "attention_chunk_size"))
            out.append(LayerCache("chunked", "chunked", i, attention_kv(heads, dim, ctx), window=c))
        elif t != "linear_attention" or not linear_ok:
            raise SpecError(f"layer {i}: unsupported layer type {t!r}")
    return out


# --------------------------------------------------------------------------- MLA / DSA


def mla(config: Config, ctx: Context) -> list[LayerCache]:
    """DeepSeek-V3 MLA: one latent row of `kv_lora_rank + qk_rope_head_dim`
    values per position per layer, shared by all heads, so tensor parallelism
    does not split it. DeepSeek-V3.2 adds the sparse-attention indexer key: an
    FP8 `index_head_dim` key plus one FP32 scale per 128 values, per position
    per layer, whatever the KV dtype."""
    n = int(need(config, "num_hidden_layers"))
    latent = int(need(config, "kv_lora_rank")) + int(need(config, "qk_rope_head_dim"))
    out = [LayerCache("mla", "full", i, row_bytes(latent, ctx.kv_dtype)) for i in range(n)]
    if config.get("index_head_dim"):
        idx = fp8_with_block_scales(int(config["index_head_dim"]))
        out += [LayerCache("indexer", "full", i, idx) for i in range(n)]
    return out


# --------------------------------------------------------------------------- DeepSeek-V4


def deepseek_v4(config: Config, ctx: Context) -> list[LayerCache]:
    """DeepSeek-V4 hybrid attention (byte rules of TRT-LLM's V4 cache manager,
    see research/trtllm-kvcm-v2.md §5), with h = head_dim, ih = index_head_dim:

    - every layer keeps a raw sliding window of `sliding_window` positions,
      h values per position (MQA, one KV head: not split by tensor parallelism);
    - a layer with ratio r > 0 keeps one compressed row of h values per r
      positions; ratio-4 layers add an indexer row (FP8 ih + FP32 scale / 128);
    - the compressors keep fixed FP32 state per request: ratio-4 layers an
      overlapping window of 2r positions, each 2h (KV) + 2h (score) + 2ih + 2ih
      values; ratio-128 layers r positions of h (KV) + h (score) values.
    """
    ratios = [int(r) for r in need(config, "compress_ratios")]
    n = int(need(config, "num_hidden_layers"))
    if len(ratios) < n:
        raise SpecError(f"compress_ratios has {len(ratios)} entries for {n} layers")
    h, w = int(need(config, "head_dim")), int(need(config, "sliding_window"))
    ih = int(config.get("index_head_dim") or 0)
    out = []
    for i, r in enumerate(ratios[:n]):
        out.append(LayerCache("sliding", "sliding", i, row_bytes(h, ctx.kv_dtype), window=w))
        if r <= 0:
            continue
        out.append(LayerCache(f"compressed{r}", "compressed", i, row_bytes(h, ctx.kv_dtype), ratio=r))
        if r == 4:
            if not ih:
                raise SpecError("config is missing field 'index_head_dim', which ratio-4 layers need")
            out.append(LayerCache(f"indexer{r}", "compressed", i, fp8_with_block_scales(ih), ratio=r))
            state = 2 * r * 4 * (2 * h + 2 * h + 2 * ih + 2 * ih)
        else:
            state = r * 4 * (h + h)
        out.append(LayerCache("compressor_state", "state", i, state_bytes=state))
    return out


# --------------------------------------------------------------------------- linear attention


def gated_deltanet(config: Config, ctx: Context) -> list[LayerCache]:
    """Qwen3-Next: full-attention layers plus Gated DeltaNet layers whose state
    per request is a recurrent matrix (v_heads x k_dim x v_dim) and a causal
    convolution window of (kernel - 1) steps over 2*k_heads*k_dim + v_heads*v_dim
    channels. Heads split across tensor-parallel ranks. States stay in the dtype
    the model is served in: engines do not quantise recurrent state with the KV dtype."""
    lin: Config = config.get("linear_attention") or {}

    def get(key: str) -> Any:  # nested (`linear_attention: {...}`) or top-level HF keys
        return lin.get(key, lin.get(key.removeprefix("linear_"), config.get(key)))

    fields = (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    )
    values: dict[str, int] = {}
    for f in fields:
        value = get(f)
        if value is None:
            raise SpecError(f"config is missing field {f!r}, which linear-attention layers need")
        values[f] = int(value)
    kh = split_heads(values["linear_num_key_heads"], ctx.tp_size)
    vh = split_heads(values["linear_num_value_heads"], ctx.tp_size)
    kd, vd = values["linear_key_head_dim"], values["linear_value_head_dim"]
    dtype = served_dtype(config)
    state = row_bytes(vh * kd * vd, dtype)
    state += row_bytes((2 * kh * kd + vh * vd) * (values["linear_conv_kernel_dim"] - 1), dtype)
    out = standard_attention(config, ctx, linear_ok=True)
    for i, t in enumerate(layer_types(config)):
        if t == "linear_attention":
            out.append(LayerCache("linear_state", "state", i, state_bytes=state))
    return out


def kimi_layer_types(lin: Mapping[str, Any], n: int) -> list[str]:
    """Each layer's type from `linear_attn_config`'s 1-indexed full and KDA layer lists."""
    types = ["full_attention"] * n
    for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
        for layer in lin.get(key) or []:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= n:
                raise SpecError(f"linear_attn_config.{key} holds {layer!r}, not a layer number 1..{n}")
            types[layer - 1] = kind
    return types


def kimi_linear(config: Config, ctx: Context) -> list[LayerCache]:
    """Kimi Linear: MLA full-attention layers (one latent row per position, as in
    `mla`) and KDA (Kimi Delta Attention) layers, which keep per request a
    recurrent H x D x D matrix and causal-convolution windows of (kernel - 1)
    steps over Q, K and V (3 x H x D channels): vLLM's `kda_state_shape`, in the
    dtype the model is served in. `linear_attn_config` lists both kinds of
    layer, 1-indexed (transformers KimiLinearConfig)."""
    n = int(need(config, "num_hidden_layers"))
    lin = need(config, "linear_attn_config")
    if not isinstance(lin, Mapping):
        raise SpecError("linear_attn_config must be an object")
    types = layer_types(config) if config.get("layer_types") else kimi_layer_types(lin, n)
    values = {}
    for key in ("num_heads", "head_dim", "short_conv_kernel_size"):
        if lin.get(key) is None:
            raise SpecError(f"linear_attn_config is missing field {key!r}, which KDA layers need")
        values[key] = int(lin[key])
    h, d = split_heads(values["num_heads"], ctx.tp_size), values["head_dim"]
    dtype = served_dtype(config)
    state = row_bytes(h * d * d, dtype) + row_bytes(3 * h * d * (values["short_conv_kernel_size"] - 1), dtype)
    latent = row_bytes(int(need(config, "kv_lora_rank")) + int(need(config, "qk_rope_head_dim")), ctx.kv_dtype)
    out = []
    for i, t in enumerate(types):
        if t == "linear_attention":
            out.append(LayerCache("linear_state", "state", i, state_bytes=state))
        elif t == "full_attention":
            out.append(LayerCache("mla", "full", i, latent))
        else:
            raise SpecError(f"layer {i}: unsupported layer type {t!r}")
    return out
