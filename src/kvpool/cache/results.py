"""What an allocation answers: success, or the pages it lacked per group.

Every method that may refuse for lack of pages (`resize`, `resize_many`,
`extend`, `can_resize`, `can_create`, `add_dummy_requests`) returns one of these instead of
a bare bool, so the reason travels with the answer. A result is truthy when the
allocation succeeded; on refusal nothing was changed (docs/design.md, rule 6).
"""

from __future__ import annotations

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
    the hit stays as it is). Truthy when it fits."""

    hit: int
    short: Mapping[str, int] = field(default_factory=dict)
    taken: Mapping[str, int] = field(default_factory=dict)
    spare: Mapping[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return not self.short
