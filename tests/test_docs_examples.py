"""Every ```python example in README.md and docs/*.md runs.

The blocks of one file run in order in one namespace, as a reader would type
them, so a later block may use what an earlier one defined. A block whose
first line is `# not run` is skipped (an outline that needs a model or the
caller's own functions); one that imports torch is skipped when torch is absent.
An expression line whose trailing comment is a Python literal
(`plan.pages("sliding")  # 16425`) must evaluate to that value.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SKIP_MARK = "# not run"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of each ```python block of `path`."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def claimed_values(src: str) -> dict[int, object]:
    """Line number (1-based in the block) -> the literal its comment claims,
    for each top-level expression statement of a single line."""
    lines = src.splitlines()
    out: dict[int, object] = {}
    for node in ast.parse(src).body:
        if not isinstance(node, ast.Expr) or node.lineno != node.end_lineno:
            continue
        comment = lines[node.lineno - 1][node.end_col_offset or 0 :].strip()
        if not comment.startswith("#"):
            continue
        try:
            out[node.lineno] = ast.literal_eval(comment[1:].strip())
        except (ValueError, SyntaxError):
            continue
    return out


def run_block(src: str, name: str, namespace: dict[str, object]) -> None:
    """Run `src` statement by statement, checking each claimed value."""
    claims = claimed_values(src)
    for node in ast.parse(src).body:
        if node.lineno in claims:
            assert isinstance(node, ast.Expr)
            value = eval(compile(ast.Expression(node.value), name, "eval"), namespace)  # noqa: S307
            assert value == claims[node.lineno], (
                f"{name}+{node.lineno}: {ast.unparse(node.value)} is {value!r}, "
                f"the comment says {claims[node.lineno]!r}"
            )
        else:
            exec(compile(ast.Module([node], []), name, "exec"), namespace)  # noqa: S102


def test_claimed_values_are_read_from_literal_comments_only() -> None:
    src = "x = 1  # 2\nx  # 1\nx + 1  # 2, 3\nprint(x)  # a count\n"
    assert claimed_values(src) == {2: 1, 3: (2, 3)}
    with pytest.raises(AssertionError, match="the comment says"):
        run_block("y = 5\ny  # 6\n", "t", {})


def needs_torch(src: str) -> bool:
    return re.search(r"^\s*(import|from)\s+torch\b", src, re.M) is not None


def test_the_extractor_finds_blocks() -> None:
    # the README documents the library in python blocks; an extractor that
    # finds none would pass every file vacuously
    assert len(blocks(ROOT / "README.md")) >= 3
    assert blocks(ROOT / "docs" / "cache.md")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_python_examples_run(path: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    for line, src in blocks(path):
        if src.lstrip().startswith(SKIP_MARK) or (needs_torch(src) and not HAS_TORCH):
            continue
        try:
            run_block(src, f"{path.name}:{line}", namespace)
        except AssertionError:
            raise
        except Exception as e:
            pytest.fail(f"{path.name} block at line {line} raised {type(e).__name__}: {e}")
    if not blocks(path):
        pytest.skip(f"{path.name} has no python examples")
