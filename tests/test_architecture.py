"""The house rules of docs/design.md, checked on the source itself: no module
imports another module's private name and the package's runtime imports form no
circle. A file past about 500 lines is a hint to look for a second concept in it
(a warning, not a failure: a file is split by concept, not by line count)."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kvpool"
ROOT = SRC.parents[1]


def modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def runtime_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every import outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    bad = []
    for path in [*SRC.rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        for module, names, line in runtime_imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if module.startswith("kvpool") and private:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {private} from {module}")
    assert not bad, "\n".join(bad)


def test_the_package_has_no_import_circles() -> None:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for module, names, _ in runtime_imports(path):
            targets = [f"{module}.{n}" for n in names] + [module]
            for t in targets:
                if t in mods and t != name:
                    graph[name].add(t)
                    break
    # a package's __init__ re-exporting its modules is not a circle of concepts
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, stack: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend(stack[stack.index(nxt) :] + [node, nxt] if nxt in stack else [node, nxt])
                return True
            if nxt not in state and visit(nxt, [*stack, node]):
                return True
        state[node] = 2
        return False

    for m in sorted(graph):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


LONG_FILE_HINT = 500


def test_long_source_files_are_named_as_a_hint() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > LONG_FILE_HINT
    }
    for path, n in sorted(long.items()):
        warnings.warn(f"{path} has {n} lines: does it hold a second concept?", stacklevel=1)


def test_tests_import_factories_from_helper_modules_not_from_other_tests() -> None:
    bad = [
        f"{p.name}:{line} imports {module}"
        for p in (ROOT / "tests").glob("*.py")
        for module, _, line in runtime_imports(p)
        if module.startswith("test_")
    ]
    assert not bad, bad


def test_the_cli_only_parses_and_prints() -> None:
    """docs/design.md, layers: `cli` sits on top of `deploy`. No module outside `cli` (but
    `python -m kvpool`) and no benchmark imports the CLI; `deploy` and the layers below
    import no `cli`; `kvpool serve` calls the library and builds no command line."""
    bad = []
    sources = [*SRC.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    for path in sources:
        name = str(path.relative_to(ROOT))
        if "/kvpool/cli/" in name or name.endswith("kvpool/__main__.py"):
            continue
        for module, _, line in runtime_imports(path):
            if module.startswith("kvpool.cli"):
                bad.append(f"{name}:{line} imports {module}")
    assert not bad, "\n".join(bad)
    serve = (SRC / "cli" / "serve_cmd.py").read_text()
    assert "deploy.fit(" in serve and "build_parser" not in serve and "parse_args" not in serve


# the layers `kvpool.fleet` may import (docs/design.md: it sits above sim), and who may import it
FLEET_IMPORTS = (
    "fleet",
    "sim",
    "sched",
    "cache",
    "index",
    "plan",
    "spec",
    "presets",
    "models",
    "trace",
    "errors",
    "units",
    "lazy",
)


def test_the_fleet_sits_above_the_simulator() -> None:
    bad = []
    for name, path in modules().items():
        for module, _, line in runtime_imports(path):
            if not module.startswith("kvpool."):
                continue
            layer = module.split(".")[1]
            if name.startswith("kvpool.fleet") and layer not in FLEET_IMPORTS:
                bad.append(f"{name}:{line} imports {module}")
            if layer == "fleet" and not name.startswith(("kvpool.fleet", "kvpool.deploy", "kvpool.cli")):
                bad.append(f"{name}:{line} imports {module} (only deploy and the CLI sit above the fleet)")
    assert not bad, bad


def test_the_prefix_cache_and_suspension_use_the_cold_store_interface() -> None:
    """cache/prefix_hit.py, cache/prefix.py and cache/suspension.py see the
    cold tiers through `cache.cold.ColdStore` alone (docs/design.md,
    interfaces): none names the tiers' class nor reaches into a tier's slots, LRU or pins."""
    internals = ("ColdTier", ".held", ".free[", ".pinned", ".pin(", ".unpin(", ".levels(", ".locate(", ".copies")
    bad = [
        f"{name}: {word}"
        for name in ("prefix.py", "prefix_hit.py", "suspension.py")
        for word in internals
        if word in (SRC / "cache" / name).read_text()
    ]
    assert not bad, bad


def test_tier_media_are_named_by_the_enum() -> None:
    """Where a page lives is `kvpool.media.Medium`; its names appear as string
    literals only where they are a consumer's wire names (cache/kv_wire.py,
    index/prefix_index.py) or the enum itself (Ray's "CPU" resource is no tier)."""
    wire = {"media.py", "kv_wire.py", "prefix_index.py"}
    bad = []
    for path in SRC.rglob("*.py"):
        if path.name in wire:
            continue
        tree = ast.parse(path.read_text())
        ray = {
            id(arg)
            for call in ast.walk(tree)
            if isinstance(call, ast.Call) and "cluster_resources" in ast.unparse(call.func)
            for arg in call.args
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ("CPU", "DISK", "GPU") and id(node) not in ray:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not bad, bad


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+")


def test_text_cites_docs_not_issue_numbers() -> None:
    """docs/design.md, rule 9: comments, docstrings and docs cite the docs in the
    repository, never this project's issue numbers, which mean nothing to a reader of a clone."""
    paths = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder, pattern in (("src", "*.py"), ("tests", "*.py"), ("benchmarks", "*.py"), ("docs", "*.md")):
        paths += (ROOT / folder).rglob(pattern)
    paths += (ROOT / "tests" / "data").rglob("*.md")
    bad = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in paths
        if p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not bad, bad


def test_the_issue_number_pattern_finds_what_it_names() -> None:
    assert ISSUE_NUMBER.search("fixed (issue 30)") and ISSUE_NUMBER.search("Issues #41")
    assert not ISSUE_NUMBER.search("an issue with 30 pages")
