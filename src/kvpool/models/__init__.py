"""Where a model comes from: a bundled preset, a local path, or a Hugging Face id
(local cache first). See docs/models.md, "Hugging Face ids"."""

from kvpool.models.source import FORMS, ModelSource, resolve_model, weights_folder

__all__ = ["FORMS", "ModelSource", "resolve_model", "weights_folder"]
