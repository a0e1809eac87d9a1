"""What a prefill worker hands a decode worker, per pool group, and how long
it takes over a link.

A prompt of L tokens, computed on a prefill worker, continues on a decode
worker at position L: the decode side needs the KV of positions [0, L) that
its next step can still read, which is the request's live pages at capacity L
and history L (the first decode token, at position L, in flight). Each group's
share is `spec.pages.pages_needed` through the group's kind rule (docs/design.md,
rule 1; no second arithmetic here):

- full and MLA groups: every page of the history, `ceil(L / tpb)`;
- compressed(r) groups: the same pages, each holding tpb / r rows;
- sliding(W) groups: the pages the window still reaches, the stale ones
  (`floor((L + 1 - W) / tpb)`) stay behind;
- chunked(C) groups: the pages of the current chunk;
- state groups: one state.

Whole pages move (the transfer engines move blocks: vLLM's NixlConnector reads
the decode side's block ids, clipped to the window's tail and the state-bearing
slot), so a group's bytes are its pages times its page bytes. The spec is one
tensor-parallel rank's share: with TP on both sides every rank hands over its
own shard over its own link, in parallel, so the time is one rank's bytes over
one link. Checked against vLLM's own decode-side allocation
(`KVCacheManager.allocate_slots` adopting L external tokens, counted per group)
in tests/test_fleet_handoff_vllm.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import KvpoolError
from kvpool.presets import FabricLink, GpuSpec, load_link
from kvpool.sim.transfers import copy_seconds
from kvpool.spec import ModelSpec
from kvpool.spec.pages import pages_needed
from kvpool.units import is_positive_int


class HandoffError(KvpoolError, ValueError):
    """A handoff that cannot be stated: no prompt, or a GPU without a link."""


@dataclass(frozen=True)
class GroupHandoff:
    """One group's share of a handoff: `slots` pages (one state slot for a
    state group) of `slot_bytes` each."""

    group: str
    kind: str
    slots: int
    slot_bytes: int

    @property
    def bytes(self) -> int:
        return self.slots * self.slot_bytes


@dataclass(frozen=True)
class Handoff:
    """What a request of `prompt_tokens` moves from prefill to decode, per group."""

    prompt_tokens: int
    groups: tuple[GroupHandoff, ...]

    @property
    def bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def of(self, group: str) -> GroupHandoff:
        """The share of the group named `group`."""
        for g in self.groups:
            if g.group == group:
                return g
        raise HandoffError(f"no group {group!r} in this handoff; groups: {', '.join(g.group for g in self.groups)}")


def handoff(spec: ModelSpec, prompt_tokens: int) -> Handoff:
    """The pages (or state) of every group a decode worker needs to continue a
    prompt of `prompt_tokens` computed elsewhere (module docstring)."""
    if not is_positive_int(prompt_tokens):
        raise HandoffError(f"a handoff needs a positive prompt length, got {prompt_tokens!r}")
    return Handoff(
        prompt_tokens,
        tuple(
            GroupHandoff(g.name, g.kind, pages_needed(g, prompt_tokens, prompt_tokens), g.slot_bytes)
            for g in spec.groups
        ),
    )


def bytes_per_token(spec: ModelSpec, prompt_tokens: int) -> float:
    """A handoff's bytes per prompt token at this prompt length: what a
    simulator that charges a transfer by the token (Dynamo's mocker,
    `kv_transfer_bytes_per_token`) should be given. It depends on the length
    when a group keeps a window or a state."""
    return handoff(spec, prompt_tokens).bytes / prompt_tokens


def handoff_link(gpu: GpuSpec, link: str | None = None) -> FabricLink:
    """The link a handoff crosses: `link` by name (`nvlink4`, `ib-ndr`,
    `roce-400gbe`, `pcie5-x16`, ...), else the GPU's own scale-up link (prefill
    and decode in one NVLink domain, or on one PCIe switch)."""
    name = link if link is not None else gpu.scale_up_link
    if name is None:
        raise HandoffError(f"{gpu.name} has no GPU-to-GPU link in its preset; name one (e.g. ib-ndr)")
    return load_link(name)


def handoff_seconds(h: Handoff, link: FabricLink) -> float:
    """Seconds a handoff keeps `link` busy at its nominal rate (a floor: no
    per-transfer latency, no protocol overhead), `sim.transfers.copy_seconds`."""
    return copy_seconds(h.bytes, link.bytes_per_s)
