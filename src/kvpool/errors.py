"""Typed exceptions. Every user-facing failure is a `KvpoolError`; the CLI turns
one into a single line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class KvpoolError(Exception):
    """Base class: a problem with the input, not a bug in kvpool."""


class SpecError(KvpoolError, ValueError):
    """A model config cannot be turned into a KV spec (missing field, bad value)."""


class UnknownPresetError(SpecError):
    """A preset name that is not bundled; `suggestions` holds the closest names.
    `also` is appended to the message (e.g. the other forms a MODEL may take)."""

    def __init__(self, kind: str, name: str, suggestions: list[str], available: list[str], also: str = ""):
        self.kind, self.name, self.suggestions = kind, name, suggestions
        self.available, self.also = available, also
        hint = f"did you mean {', '.join(suggestions)}?" if suggestions else f"available: {', '.join(available)}"
        super().__init__(f"unknown {kind} preset {name!r}; {hint}{also}")


class ModelSourceError(KvpoolError):
    """A MODEL argument that names no preset, no local path and no usable
    Hugging Face id (not in the cache while offline, gated, not found, ...)."""


class LimitsError(KvpoolError, ValueError):
    """Serving limits that contradict each other or are out of range."""


class InfeasiblePlanError(KvpoolError):
    """The memory budget cannot hold a constraint's pages.

    Attributes name what failed and what would fit: `constraint`, `group`,
    `short_pages` (pages missing in `group`), `max_batch_size`, `max_seq_len`
    and `max_num_tokens` (the largest values that would fit, each with the
    others unchanged; 0 if none), `kv_memory_bytes` (the smallest budget that
    would, whole MiB; 0 if not known). Each was re-planned before it was given.
    """

    def __init__(
        self,
        message: str,
        *,
        constraint: str = "",
        group: str = "",
        short_pages: int = 0,
        max_batch_size: int = 0,
        max_seq_len: int = 0,
        max_num_tokens: int = 0,
        kv_memory_bytes: int = 0,
    ):
        super().__init__(message)
        self.constraint, self.group, self.short_pages = constraint, group, short_pages
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.max_num_tokens, self.kv_memory_bytes = max_num_tokens, kv_memory_bytes


class OutOfPagesError(KvpoolError):
    """A pool has no free page for an allocation that was required to succeed."""


@contextlib.contextmanager
def flagged(flag: str) -> Iterator[None]:
    """A KvpoolError raised while handling `flag`'s value comes out as one line
    naming the flag (`--trace: ...`), unless its text names the flag already."""
    try:
        yield
    except KvpoolError as e:
        if flag in str(e):
            raise
        raise KvpoolError(f"{flag}: {e}") from None
