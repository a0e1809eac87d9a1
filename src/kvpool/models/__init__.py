"""Where a model comes from: presets, paths, Hugging Face ids, and its weights."""
