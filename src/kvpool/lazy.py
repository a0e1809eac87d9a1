"""`lazy_names`: a package's public names, each loaded from its module on first
use (PEP 562's module `__getattr__`), so that importing the package loads none
of those modules: `kvpool simulate` of one replica imports no fit search or
fleet loop, the CLI names torch architectures without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_names(package: str, where: Mapping[str, Sequence[str]], modules: Sequence[str] = ()) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name of `where[module]` is
    imported from `module`, and each submodule of `modules` imported, when first
    asked for; any other name raises AttributeError, as a module without it does."""
    home = {name: module for module, names in where.items() for name in names}

    def getattr_(name: str) -> Any:
        if name in home:
            return getattr(importlib.import_module(home[name]), name)
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_
