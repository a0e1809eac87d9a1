"""The parameters of a model, from its config.json alone, one family at a time.

`matrices(config)` lists every weight tensor the model's text decoder holds, named
as in its Hugging Face checkpoint (`model.layers.{i}.self_attn.q_proj.weight`), with
its shape (rows x cols; a vector has cols = 1) and a `count` for identical copies
(routed experts). With H = hidden_size, V = vocab_size, L = num_hidden_layers,
n / k = query / KV heads of head_dim d, I = intermediate_size:

- embeddings V x H; lm_head V x H unless `tie_word_embeddings` (default per
  transformers config class: true for Gemma, false for the others); final norm H;
- attention (GQA/MQA/MHA) per layer: q n*d x H, k and v k*d x H each, o H x n*d;
  biases where the family has them (Qwen2: q, k, v; `attention_bias`, default true
  for gpt-oss only: q, k, v, o);
  Qwen3 / Gemma 3 add q_norm and k_norm (d each); gpt-oss one sink per head;
- MLA (DeepSeek-V2/V3, Kimi-K2) per layer, q_lora r_q, kv_lora r_kv, nope / rope /
  v head dims: q_a r_q x H + q_a_layernorm r_q + q_b n*(nope+rope) x r_q (or q
  n*(nope+rope) x H without q_lora), kv_a (r_kv+rope) x H + kv_a_layernorm r_kv,
  kv_b n*(nope+v) x r_kv, o H x n*v; DeepSeek-V3.2's indexer adds wq_b
  (ih*in) x r_q, wk ih x H, k_norm 2*ih (LayerNorm weight + bias), weights_proj in x H;
- dense gated MLP: gate and up I x H, down H x I (`mlp_bias`: + biases);
- MoE layer: router E x H (+ E: gpt-oss bias, DeepSeek-V3 e_score_correction_bias),
  E routed experts of gate/up/down at moe_intermediate_size, shared experts as one
  dense MLP of n_shared x moe_intermediate_size (Qwen2-MoE: shared_expert_intermediate_size
  plus a 1 x H shared_expert_gate); which layers are MoE follows each family's
  config (first_k_dense_replace / moe_layer_freq, decoder_sparse_step / mlp_only_layers);
- norms per layer: 2 x H (Gemma 2/3: 4 x H).

Multi-token-prediction layers (`num_nextn_predict_layers`) are not counted: engines
do not load them by default (the published 671B of DeepSeek-V3 excludes its 14B MTP
module). A **vision tower** (`vision_config`) is counted, since engines load it and
its bytes come out of the KV budget: SigLIP (`siglip_vision_model`, transformers'
SiglipVisionModel: patch embedding 3*p*p x Hv + bias, (image/p)^2 position
embeddings, per layer two LayerNorms, q/k/v/o Hv x Hv with biases and fc1/fc2 at
intermediate_size with biases, a post LayerNorm, the attention-pooling head when
`vision_use_head`), plus Gemma 3's projector (mm_input_projection Hv x H and its
RMSNorm Hv). Any other vision or audio tower is refused by name rather than
counted as nothing. A family not listed in `FAMILIES` is refused by name
(docs/design.md, rule 7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpool.errors import KvpoolError

Config = Mapping[str, Any]

DENSE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "olmo2", "phi3")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
MLA = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")
FAMILIES = DENSE + MOE + MLA
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")


class ParameterCountError(KvpoolError):
    """The parameters of a config cannot be counted (a field the formula needs is missing)."""


class UnknownFamilyError(ParameterCountError):
    """kvpool has no parameter formula for this model family."""


@dataclass(frozen=True)
class Matrix:
    """One weight tensor (or `count` identical ones): rows x cols values."""

    name: str
    rows: int
    cols: int = 1
    count: int = 1

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


def _get(config: Config, key: str, default: Any = None) -> Any:
    value = config.get(key)
    if value is None:
        if default is None:
            raise ParameterCountError(f"config is missing field {key!r}, which the parameter count needs")
        return default
    return value


def model_type(config: Config) -> str:
    """The family name (`model_type`), refused unless kvpool can count its parameters."""
    family = str(config.get("model_type") or "")
    if family not in FAMILIES:
        what = f"model family {family!r}" if family else "a config without model_type"
        raise UnknownFamilyError(
            f"no parameter formula for {what}; give --weights-memory or --non-kv-memory, "
            f"or a folder with its *.safetensors (formulas: {', '.join(FAMILIES)})"
        )
    return family


def _attention(c: Config, family: str, p: str) -> list[Matrix]:
    h, n = int(_get(c, "hidden_size")), int(_get(c, "num_attention_heads"))
    k = int(c.get("num_key_value_heads") or n)
    d = int(c.get("head_dim") or h // n)
    out = [
        Matrix(f"{p}.q_proj.weight", n * d, h),
        Matrix(f"{p}.k_proj.weight", k * d, h),
        Matrix(f"{p}.v_proj.weight", k * d, h),
        Matrix(f"{p}.o_proj.weight", h, n * d),
    ]
    bias = c.get("attention_bias", family == "gpt_oss")  # GptOssConfig defaults it to true
    if family in ("qwen2", "qwen2_moe") or bias:
        out += [Matrix(f"{p}.q_proj.bias", n * d), Matrix(f"{p}.k_proj.bias", k * d), Matrix(f"{p}.v_proj.bias", k * d)]
    if bias:
        out.append(Matrix(f"{p}.o_proj.bias", h))
    if family in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):
        out += [Matrix(f"{p}.q_norm.weight", d), Matrix(f"{p}.k_norm.weight", d)]
    if family == "olmo2":
        out += [Matrix(f"{p}.q_norm.weight", n * d), Matrix(f"{p}.k_norm.weight", k * d)]
    if family == "gpt_oss":
        out.append(Matrix(f"{p}.sinks", n))
    return out


def _mla(c: Config, p: str) -> list[Matrix]:
    h, n = int(_get(c, "hidden_size")), int(_get(c, "num_attention_heads"))
    nope, rope, v = int(_get(c, "qk_nope_head_dim")), int(_get(c, "qk_rope_head_dim")), int(_get(c, "v_head_dim"))
    r_kv, r_q = int(_get(c, "kv_lora_rank")), c.get("q_lora_rank")
    out = []
    if r_q:
        r_q = int(r_q)
        out += [
            Matrix(f"{p}.q_a_proj.weight", r_q, h),
            Matrix(f"{p}.q_a_layernorm.weight", r_q),
            Matrix(f"{p}.q_b_proj.weight", n * (nope + rope), r_q),
        ]
    else:
        out.append(Matrix(f"{p}.q_proj.weight", n * (nope + rope), h))
    out += [
        Matrix(f"{p}.kv_a_proj_with_mqa.weight", r_kv + rope, h),
        Matrix(f"{p}.kv_a_layernorm.weight", r_kv),
        Matrix(f"{p}.kv_b_proj.weight", n * (nope + v), r_kv),
        Matrix(f"{p}.o_proj.weight", h, n * v),
    ]
    if c.get("index_head_dim"):
        ih, heads = int(c["index_head_dim"]), int(_get(c, "index_n_heads"))
        out += [
            Matrix(f"{p}.indexer.wq_b.weight", ih * heads, int(_get(c, "q_lora_rank"))),
            Matrix(f"{p}.indexer.wk.weight", ih, h),
            Matrix(f"{p}.indexer.k_norm.weight", ih),
            Matrix(f"{p}.indexer.k_norm.bias", ih),
            Matrix(f"{p}.indexer.weights_proj.weight", heads, h),
        ]
    return out


def _gated_mlp(p: str, h: int, inter: int, *, count: int = 1, bias: bool = False) -> list[Matrix]:
    out = [
        Matrix(f"{p}.gate_proj.weight", inter, h, count),
        Matrix(f"{p}.up_proj.weight", inter, h, count),
        Matrix(f"{p}.down_proj.weight", h, inter, count),
    ]
    if bias:
        out += [
            Matrix(f"{p}.gate_proj.bias", inter),
            Matrix(f"{p}.up_proj.bias", inter),
            Matrix(f"{p}.down_proj.bias", h),
        ]
    return out


def is_moe_layer(c: Config, family: str, i: int) -> bool:
    """Whether layer `i` is a MoE layer, by each family's own config fields."""
    if family in ("mixtral", "gpt_oss"):
        return True
    if family in MLA:
        return _mla_moe_layer(c, i)
    if family in ("qwen2_moe", "qwen3_moe"):
        return _qwen_moe_layer(c, i)
    return False


def _mla_moe_layer(c: Config, i: int) -> bool:
    """DeepSeek's rule: routed experts from `first_k_dense_replace` on, every `moe_layer_freq`-th layer."""
    first, freq = int(c.get("first_k_dense_replace") or 0), int(c.get("moe_layer_freq") or 1)
    return bool(c.get("n_routed_experts")) and i >= first and i % freq == 0


def _qwen_moe_layer(c: Config, i: int) -> bool:
    """Qwen MoE's rule: every `decoder_sparse_step`-th layer not in `mlp_only_layers`."""
    step = int(c.get("decoder_sparse_step") or 1)
    experts = int(c.get("num_experts") or 0)
    return experts > 0 and i not in (c.get("mlp_only_layers") or []) and (i + 1) % step == 0


def _mlp(c: Config, family: str, i: int, p: str) -> list[Matrix]:
    h = int(_get(c, "hidden_size"))
    if not is_moe_layer(c, family, i):
        return _gated_mlp(p, h, int(_get(c, "intermediate_size")), bias=bool(c.get("mlp_bias")))
    if family == "mixtral":
        e, inter = int(_get(c, "num_local_experts")), int(_get(c, "intermediate_size"))
        q = p.replace(".mlp", ".block_sparse_moe")
        return [
            Matrix(f"{q}.gate.weight", e, h),
            Matrix(f"{q}.experts.w1.weight", inter, h, e),
            Matrix(f"{q}.experts.w3.weight", inter, h, e),
            Matrix(f"{q}.experts.w2.weight", h, inter, e),
        ]
    if family == "gpt_oss":
        e, inter = int(_get(c, "num_local_experts")), int(_get(c, "intermediate_size"))
        return [
            Matrix(f"{p}.router.weight", e, h),
            Matrix(f"{p}.router.bias", e),
            Matrix(f"{p}.experts.gate_up_proj", 2 * inter, h, e),
            Matrix(f"{p}.experts.gate_up_proj_bias", 2 * inter, 1, e),
            Matrix(f"{p}.experts.down_proj", h, inter, e),
            Matrix(f"{p}.experts.down_proj_bias", h, 1, e),
        ]
    inter = int(_get(c, "moe_intermediate_size"))
    if family in MLA:
        e = int(_get(c, "n_routed_experts"))
        out = [Matrix(f"{p}.gate.weight", e, h)]
        if family != "deepseek_v2":  # V3's aux-loss-free routing stores one bias per expert
            out.append(Matrix(f"{p}.gate.e_score_correction_bias", e))
        out += _gated_mlp(f"{p}.experts", h, inter, count=e)
        shared = int(c.get("n_shared_experts") or 0)
        return out + (_gated_mlp(f"{p}.shared_experts", h, shared * inter) if shared else [])
    e = int(_get(c, "num_experts"))
    out = [Matrix(f"{p}.gate.weight", e, h), *_gated_mlp(f"{p}.experts", h, inter, count=e)]
    if family == "qwen2_moe" and c.get("shared_expert_intermediate_size"):
        out += _gated_mlp(f"{p}.shared_expert", h, int(c["shared_expert_intermediate_size"]))
        out.append(Matrix(f"{p}.shared_expert_gate.weight", 1, h))
    return out


def matrices(config: Config) -> list[Matrix]:
    """Every weight tensor of the text decoder `config` describes (module docstring).
    Raises UnknownFamilyError for a family without a formula, KvpoolError for a
    missing field."""
    family = model_type(config)
    h, v, n_layers = (
        int(_get(config, "hidden_size")),
        int(_get(config, "vocab_size")),
        int(_get(config, "num_hidden_layers")),
    )
    out = [Matrix("model.embed_tokens.weight", v, h)]
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    if family in ("gemma2", "gemma3", "gemma3_text"):
        norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    if family == "olmo2":
        norms = ("post_attention_layernorm", "post_feedforward_layernorm")
    for i in range(n_layers):
        p = f"model.layers.{i}"
        attn = _mla(config, f"{p}.self_attn") if family in MLA else _attention(config, family, f"{p}.self_attn")
        out += attn + _mlp(config, family, i, f"{p}.mlp")
        out += [Matrix(f"{p}.{norm}.weight", h) for norm in norms]
    out.append(Matrix("model.norm.weight", h))
    if not config.get("tie_word_embeddings", family in TIED_BY_DEFAULT):
        out.append(Matrix("lm_head.weight", v, h))
    return out + tower_matrices(config, family, h)


VISION_TOWERS = ("siglip_vision_model",)


def _siglip_layer(q: str, h: int, inter: int) -> list[Matrix]:
    """One encoder layer of a SigLIP tower: attention with biases, an MLP, two norms."""
    out = []
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        out += [Matrix(f"{q}.self_attn.{proj}.weight", h, h), Matrix(f"{q}.self_attn.{proj}.bias", h)]
    out += [
        Matrix(f"{q}.mlp.fc1.weight", inter, h),
        Matrix(f"{q}.mlp.fc1.bias", inter),
        Matrix(f"{q}.mlp.fc2.weight", h, inter),
        Matrix(f"{q}.mlp.fc2.bias", h),
    ]
    return out + [Matrix(f"{q}.{norm}.{w}", h) for norm in ("layer_norm1", "layer_norm2") for w in ("weight", "bias")]


def _siglip_head(head: str, h: int, inter: int) -> list[Matrix]:
    """SiglipMultiheadAttentionPoolingHead: probe, attention, norm, MLP."""
    return [
        Matrix(f"{head}.probe", h),
        Matrix(f"{head}.attention.in_proj_weight", 3 * h, h),
        Matrix(f"{head}.attention.in_proj_bias", 3 * h),
        Matrix(f"{head}.attention.out_proj.weight", h, h),
        Matrix(f"{head}.attention.out_proj.bias", h),
        Matrix(f"{head}.layernorm.weight", h),
        Matrix(f"{head}.layernorm.bias", h),
        Matrix(f"{head}.mlp.fc1.weight", inter, h),
        Matrix(f"{head}.mlp.fc1.bias", inter),
        Matrix(f"{head}.mlp.fc2.weight", h, inter),
        Matrix(f"{head}.mlp.fc2.bias", h),
    ]


def tower_matrices(config: Config, family: str, text_hidden: int) -> list[Matrix]:
    """The vision tower (and its projector into the text model) of a multimodal
    config; [] without one. Raises UnknownFamilyError for a tower without a formula."""
    if isinstance(config.get("audio_config"), Mapping):
        raise UnknownFamilyError(f"audio tower {config['audio_config'].get('model_type')!r} has no parameter formula")
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return []
    kind = vision.get("model_type")
    if kind not in VISION_TOWERS:
        raise UnknownFamilyError(f"vision tower {kind!r} has no parameter formula; towers with one: {VISION_TOWERS}")
    h, inter, layers = (int(_get(vision, k)) for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
    patch, image = int(_get(vision, "patch_size")), int(_get(vision, "image_size"))
    p = "vision_tower.vision_model"
    out = [
        Matrix(f"{p}.embeddings.patch_embedding.weight", h, 3 * patch * patch),
        Matrix(f"{p}.embeddings.patch_embedding.bias", h),
        Matrix(f"{p}.embeddings.position_embedding.weight", (image // patch) ** 2, h),
    ]
    for i in range(layers):
        out += _siglip_layer(f"{p}.encoder.layers.{i}", h, inter)
    out += [Matrix(f"{p}.post_layernorm.weight", h), Matrix(f"{p}.post_layernorm.bias", h)]
    if vision.get("vision_use_head", True):
        out += _siglip_head(f"{p}.head", h, inter)
    if family in ("gemma3", "gemma3_text"):  # Gemma3MultiModalProjector (the text config merged in says gemma3_text)
        out += [
            Matrix("multi_modal_projector.mm_input_projection_weight", h, text_hidden),
            Matrix("multi_modal_projector.mm_soft_emb_norm.weight", h),
        ]
    return out


def parameter_count(config: Config) -> int:
    """Parameters of the text decoder (the sum over `matrices`)."""
    return sum(m.params for m in matrices(config))
