"""What an allocation answers: success, or the pages it lacked per group.

Every method that may refuse for lack of pages (`resize`, `resize_many`,
`extend`, `can_resize`, `add_dummy_requests`) returns one of these instead of
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
