"""The architectures the reference engine implements, importable without torch
(the CLI lists them in `kvpool generate --help`)."""

ARCHS = ("llama", "qwen3", "mistral", "gemma3")
