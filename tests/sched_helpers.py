"""Factories of the scheduler tests: tiny specs, requests, and driving a
scheduler to the end."""

from __future__ import annotations

from kvpool.sched import Scheduler, Sequence, Step
from kvpool.spec import ModelSpec, load_model_spec

TPB = 4


def _spec(**extra: object) -> ModelSpec:
    # 2 layers, 4 query heads, 2 KV heads, BF16; `extra` adds windows
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "max_position_embeddings": 1 << 16,
        "torch_dtype": "bfloat16",
        **extra,
    }
    return load_model_spec(config, tokens_per_block=TPB)


def full_spec() -> ModelSpec:
    return _spec()


def hybrid_spec(window: int = 8) -> ModelSpec:
    return _spec(sliding_window=window, layer_types=["full_attention", "sliding_attention"])


def seq(rid: int, prompt: int, out: int, first_token: int = 1000) -> Sequence:
    # distinct token ids per request unless the caller shares them on purpose
    return Sequence(rid=rid, prompt_ids=list(range(first_token * rid, first_token * rid + prompt)), max_new_tokens=out)


def chunks(step: Step) -> list[tuple[int, int, int]]:
    return [(s.rid, start, n) for s, start, n in step.prefills]


def run_step(sched: Scheduler, step: Step, token: int = 7) -> list[Sequence]:
    sampled = {s.rid: [token] for s, _ in step.decodes}
    sampled.update({s.rid: [token] for s, st_, n in step.prefills if st_ + n == s.num_tokens})
    return sched.update(step, sampled)


def drain(sched: Scheduler, limit: int = 10_000) -> list[Sequence]:
    done: list[Sequence] = []
    for _ in range(limit):
        step = sched.schedule()
        if step is None:
            return done
        done += run_step(sched, step)
    raise AssertionError("scheduler did not drain")
