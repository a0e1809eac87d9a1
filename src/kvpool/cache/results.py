"""What an allocation answers: success, or the pages it lacked per group.

Every method that may refuse for lack of pages (`resize`, `resize_many`,
`extend`, `can_resize`, `can_create`, `add_dummy_requests`) returns one of these instead of
a bare bool, so the reason travels with the answer. A result is truthy when the
allocation succeeded; on refusal nothing was changed (docs/design.md, rule 6).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Resize:
    """`short`: pages missing per group (only groups that lacked pages);
    empty when the resize succeeded."""

    short: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return not self.short

    @property
    def ok(self) -> bool:
        return not self.short


RESIZED = Resize()  # the one success value: the hot path allocates nothing


@dataclass(frozen=True, slots=True)
class Dummies:
    """`ids`: the dummy requests registered (release each with `free`), empty
    when refused; `short`: pages missing per group then."""

    ids: tuple[int, ...] = ()
    short: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return not self.short

    @property
    def ok(self) -> bool:
        return not self.short


@dataclass(frozen=True, slots=True)
class CreateCheck:
    """What `KVCacheManager.can_create` answers: `hit`, the tokens `create`
    would reuse; `short`, pages missing per pool for the hit and the first
    positions after it together (empty: both fit); `taken`, the pages the hit
    alone would take from each pool's free count (its evictable cached pages
    and the copies it brings in from a cold tier); `spare`, per pool, the
    pages allocations may take before they evict a page of the hit (so that
    the hit stays as it is). `ids`: the prompt's token ids as the manager
    checked and digested them (None without a prompt or with reuse off), for
    the caller to pass back to `create` or `can_create` of the same prompt,
    which then take them as they are, with no copy, check or comparison: read
    them, never write them. Truthy when it fits."""

    hit: int
    short: Mapping[str, int] = field(default_factory=dict)
    taken: Mapping[str, int] = field(default_factory=dict)
    spare: Mapping[str, int] = field(default_factory=dict)
    ids: array[int] | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return not self.short
