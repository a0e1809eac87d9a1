"""The engine registry: its names are its entries, and naming them (what the
simulator of kvpool's own policies asks) loads no engine's module."""

from __future__ import annotations

import subprocess
import sys

from kvpool.engines import registry


def test_the_registrys_names_are_its_entries_and_naming_them_loads_no_engine() -> None:
    """`registry.NAMES` spells out the engines `entries.py` builds, in order; a
    fresh interpreter that asks for the policies and kvpool's own admission
    rule loads no engine's module (`kvpool simulate` of kvpool's policies)."""
    assert tuple(registry.ENTRIES) == registry.NAMES
    assert {n: e.releases for n, e in registry.ENTRIES.items()} == registry.RELEASES
    code = (
        "import sys; from kvpool.engines import registry; "
        "assert registry.admission_of('reference') == 'optimistic' and registry.POLICIES; "
        "print(sorted(m for m in sys.modules if m.startswith('kvpool.engines.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["kvpool.engines.common", "kvpool.engines.engine", "kvpool.engines.registry"])
