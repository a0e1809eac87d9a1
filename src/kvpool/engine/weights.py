"""Getting weights into `DecoderLM`: from a local Hugging Face folder
(config.json + *.safetensors), from a state dict, or from a tiny random
transformers model built from a config with a fixed seed (how the parity
tests obtain identical weights on both sides). Nothing is fetched from a hub."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kvpool.engine.arch import ARCHS, ArchConfig, EngineError
from kvpool.engine.model import DecoderLM
from kvpool.spec.jsonfile import read_json

# Checkpoint prefixes that wrap the text decoder (multimodal Gemma 3 folders).
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


def tiny_config(arch: str, **overrides: Any) -> dict[str, Any]:
    """A config dict for a tiny model of `arch` (hidden 64, vocab 256): small
    enough for CI, with sliding windows short enough that 4-token pages go stale
    within a few dozen tokens. Gemma 3 keeps the real 5 local : 1 global pattern."""
    base: dict[str, Any] = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "initializer_range": 0.1,
    }
    if arch == "llama":
        # Llama 3.1 RoPE scaling, so the scaled-frequency path runs too.
        base |= {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        }
    elif arch == "qwen3":
        base |= {
            "model_type": "qwen3",
            "num_hidden_layers": 2,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        }
    elif arch == "mistral":
        base |= {
            "model_type": "mistral",
            "num_hidden_layers": 2,
            "sliding_window": 12,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        }
    elif arch == "gemma3":
        base |= {
            "model_type": "gemma3_text",
            "num_hidden_layers": 6,
            "sliding_window": 10,
            "query_pre_attn_scalar": 16,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
        }
    elif arch == "mixtral":
        base |= {
            "model_type": "mixtral",
            "num_hidden_layers": 2,
            "sliding_window": 12,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        }
    elif arch == "qwen3_moe":
        # layer 1 of 3 keeps the dense MLP (mlp_only_layers); the top-2 weights are not renormalised
        base |= {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 3,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": False,
            "mlp_only_layers": [1],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        }
    elif arch == "gemma2":
        # Softcaps small enough to bend the logits of a random model (the
        # released 50 / 30 would barely touch them).
        base |= {
            "model_type": "gemma2",
            "num_hidden_layers": 4,
            "sliding_window": 10,
            "query_pre_attn_scalar": 16,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        }
    else:
        raise EngineError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    return base | overrides


def hf_model(config: Mapping[str, Any], seed: int = 0) -> Any:
    """A transformers causal LM with random weights drawn under `seed` (float32, eval mode)."""
    import transformers

    classes = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    }
    if config.get("model_type") not in classes:
        raise EngineError(f"no transformers class for model_type {config.get('model_type')!r}")
    config_name, model_name = classes[str(config["model_type"])]
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = getattr(transformers, config_name)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(hf_config).float().eval()
    with torch.no_grad():  # transformers leaves 3-D expert tensors unset: draw them too
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.normal_(0.0, float(config.get("initializer_range", 0.02)))
    return model


def from_state_dict(
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> DecoderLM:
    """A `DecoderLM` from a config dict and a Hugging Face state dict.
    Raises `EngineError` when tensors are missing or do not fit."""
    cfg = ArchConfig.from_hf(config)
    model = DecoderLM(cfg)
    wanted = set(model.state_dict())
    clean: dict[str, torch.Tensor] = {}
    unused: list[str] = []
    for key, tensor in state.items():
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = "model." + key[len(prefix) :]
                break
        if key in wanted:
            clean[key] = tensor
        elif key.startswith(("model.layers.", "model.norm")) and not key.endswith("inv_freq"):
            # a decoder tensor this model does not use would change its output:
            # refuse rather than drop it silently
            unused.append(key)
    missing = sorted(wanted - set(clean))
    if missing:
        raise EngineError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    if unused:
        raise EngineError(
            f"checkpoint has {len(unused)} decoder tensors the reference engine does "
            f"not implement, e.g. {sorted(unused)[:3]}"
        )
    try:
        model.load_state_dict(clean, strict=True)
    except RuntimeError as e:
        raise EngineError(f"checkpoint does not fit the config: {str(e).splitlines()[0]}") from None
    model = model.to(device=device)
    # Cast parameters only: RoPE frequencies and the embedding scale stay in
    # float32 buffers, as transformers keeps them.
    for param in model.parameters():
        param.data = param.data.to(dtype)
    return model.eval()


def tiny_model(arch: str, seed: int = 0, **overrides: Any) -> tuple[DecoderLM, Any, dict[str, Any]]:
    """(our model, the transformers model, config dict) with identical random weights."""
    config = tiny_config(arch, **overrides)
    hf = hf_model(config, seed)
    return from_state_dict(config, hf.state_dict()), hf, config


def load_folder(
    path: str | Path, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> tuple[DecoderLM, dict[str, Any]]:
    """(model, config dict) from a local folder with config.json and
    *.safetensors. `dtype` defaults to the config's (float32 on CPU for bf16/fp16
    checkpoints would change numerics, so it is kept as written)."""
    folder = Path(path)
    if not (folder / "config.json").exists():
        raise EngineError(f"{folder} has no config.json")
    config = read_json(folder / "config.json")  # bounded: bytes, numbers, nesting; a FIFO refused
    if not isinstance(config, dict):
        raise EngineError(f"{folder / 'config.json'} is not a JSON object")
    generation = folder / "generation_config.json"
    if generation.exists():  # stop ids often live here (Llama 3 instruct lists three)
        settings = read_json(generation, "generation config")
        eos = settings.get("eos_token_id") if isinstance(settings, dict) else None
        if eos is not None:
            ids = [config.get("eos_token_id")] + (eos if isinstance(eos, list) else [eos])
            flat = [t for x in ids if x is not None for t in (x if isinstance(x, list) else [x])]
            if not all(type(t) is int and 0 <= t < 2**31 for t in flat):
                raise EngineError(f"{generation}: eos_token_id must be token ids (integers >= 0), got {eos!r:.60}")
            config["eos_token_id"] = sorted(set(flat))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise EngineError(f"{folder} has no *.safetensors weights")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except SafetensorError as e:  # a header too large, too small or not JSON: the file, not kvpool
            raise EngineError(f"{f} is not a readable safetensors file: {e}") from None
    if dtype is None:
        name = str(config.get("torch_dtype") or config.get("dtype") or "float32")
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, torch.float32)
    return from_state_dict(config, state, dtype=dtype, device=device), config


def save_folder(model: Any, config: Mapping[str, Any], path: str | Path) -> Path:
    """Write a transformers model's weights and `config` as a local HF folder
    (config.json + model.safetensors); used by tests and the CLI's --tiny."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(config), indent=2))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"))
    return folder
