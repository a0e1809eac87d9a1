"""Hugging Face ids of the bundled presets: what `vllm serve`, SGLang's
`--model-path` and TensorRT-LLM take for them."""

HF_IDS = {
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-v3.2-exp": "deepseek-ai/DeepSeek-V3.2-Exp",
    "deepseek-v4-flash": "deepseek-ai/DeepSeek-V4-Flash",
    "gemma-2-9b": "google/gemma-2-9b-it",
    "gemma-3-27b": "google/gemma-3-27b-it",
    "gemma-4-26b-a4b": "google/gemma-4-26B-A4B-it",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-4-scout-17b-16e": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "seed-oss-36b": "ByteDance-Seed/Seed-OSS-36B-Instruct",
}


def model_id_for(model: str) -> str:
    """The Hugging Face id of a bundled preset; anything else unchanged."""
    return HF_IDS.get(model, model)
