"""Every field of each supported transformers config class is classified
(implemented / irrelevant / refused) in kvpool.torch_engine.fields; refused fields
at another value raise EngineError naming the field."""

from __future__ import annotations

import pytest

from kvpool.torch_engine.arch import EngineError
from kvpool.torch_engine.fields import IMPLEMENTED, IRRELEVANT, REFUSED, check_fields
from kvpool.torch_engine.weights import tiny_config

transformers = pytest.importorskip("transformers")
CLASSES = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "mixtral": "MixtralConfig",
    "qwen3_moe": "Qwen3MoeConfig",
}


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_every_config_field_is_classified_once(model_type: str) -> None:
    fields = set(getattr(transformers, CLASSES[model_type])().to_dict())
    lists = [IMPLEMENTED[model_type], IRRELEVANT[model_type], set(REFUSED[model_type])]
    unclassified = fields - set().union(*lists)
    assert not unclassified, f"{model_type}: fields in no list: {sorted(unclassified)}"
    for i, a in enumerate(lists):
        for b in lists[i + 1 :]:
            assert not (a & b), f"{model_type}: fields in two lists: {sorted(a & b)}"


def test_every_supported_model_type_has_lists() -> None:
    from kvpool.torch_engine.arch import MODEL_TYPES

    # "gemma3" (multimodal) is read through its text_config: gemma3_text's fields.
    assert set(MODEL_TYPES) - {"gemma3"} == set(CLASSES)
    assert set(IMPLEMENTED) == set(IRRELEVANT) == set(REFUSED) == set(CLASSES)


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_refused_field_names_itself(model_type: str) -> None:
    config = tiny_config("gemma2" if model_type == "gemma2" else "gemma3", use_bidirectional_attention=True)
    with pytest.raises(EngineError, match="use_bidirectional_attention"):
        check_fields(config)
    check_fields(config | {"use_bidirectional_attention": False})
