"""Where a model comes from: a bundled preset, a local path, or a Hugging Face id
(local cache first; docs/models.md, "Hugging Face ids"), and its weights per
rank (`models.weights`: safetensors headers or a per-family parameter count)."""

from kvpool.models.source import FORMS, ModelSource, resolve_model, weights_folder

__all__ = ["FORMS", "ModelSource", "resolve_model", "weights_folder"]
