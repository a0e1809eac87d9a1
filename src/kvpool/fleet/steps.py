"""The step times of a decode replica in a disaggregated fleet.

A request handed off by a prefill replica reaches its decode replica with its
prompt's KV already computed: the decode replica allocates the prompt's pages
(as vLLM's `allocate_slots` does for the external tokens a connector will
receive: `fleet.handoff`), computes nothing for them, and its first step for
the request is a decode row that reads the prompt's KV and samples the first
token (Dynamo's mocker measures the same: disaggregated TTFT is one decode step
longer than aggregated, before the transfer). So, in a decode replica's step,
a prefill chunk that ends the prompt costs one decode row at its history, and
a chunk that does not (a prompt past the step's token budget) costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from kvpool.sched import Step
from kvpool.sim.steptime import StepTimeModel


@dataclass(frozen=True)
class DecodeSteps(StepTimeModel):
    """`StepTimeModel` of a decode replica (module docstring): decode-only
    steps as the model prices them, handed-off prompts as decode rows."""

    @classmethod
    def of(cls, model: StepTimeModel) -> DecodeSteps:
        """The decode side of `model` (the same constants)."""
        return cls(**{f.name: getattr(model, f.name) for f in fields(model)})

    def step_time(self, step: Step) -> float:
        if not step.prefills:
            return super().step_time(step)
        rows = [(s.num_computed, k) for s, k in step.decodes]
        rows += [(start + n - 1, 0) for s, start, n in step.prefills if start + n == s.num_tokens]
        if not rows:
            return 0.0
        return self.time(rows, [])  # a step with prefill rows replays no graph
