"""Every `$ kvpool ...` line of a ```console example in README.md and docs/*.md
runs and exits 0; each output line shown without an
elision (`...` or `…`) appears in the real output, spaces collapsed.

`generate` examples need torch (and a downloaded model for `--model`): they
are skipped when torch is absent, `--model` ones always (no network in tests).
Hugging Face id examples run offline against google/gemma-3-27b-it's real
config laid out as a hub cache in tmp_path (tests/hub_helpers.py); they are
skipped without huggingface_hub.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from hub_helpers import gemma3_hub
from kvpool.cli.main import main
from kvpool.models.source import HUB_ID

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_HUB = importlib.util.find_spec("huggingface_hub") is not None
ELIDED = re.compile(r"\.\.\.|…")  # a shown line cut short is not compared


def examples() -> list[tuple[str, list[str], list[str]]]:
    """(where, argv, shown output lines) of every `$ kvpool` command."""
    out: list[tuple[str, list[str], list[str]]] = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            line_no = text.count("\n", 0, m.start(1)) + 1
            lines = m.group(1).replace("\\\n", " ").splitlines()
            for i, line in enumerate(lines):
                if not line.startswith("$ kvpool "):
                    continue
                shown = []
                for follow in lines[i + 1 :]:
                    if follow.startswith("$ "):
                        break
                    shown.append(follow)
                out.append((f"{path.name}:{line_no}", shlex.split(line[2:])[1:], shown))
    return out


def norm(s: str) -> str:
    return " ".join(s.split())


EXAMPLES = examples()


@pytest.fixture(autouse=True)
def offline_hub_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every example runs offline; hub ids find a cache with gemma-3-27b-it."""
    gemma3_hub(monkeypatch, tmp_path)


def test_the_docs_have_console_examples() -> None:
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize(("where", "argv", "shown"), EXAMPLES, ids=[f"{w}:{a[0]}" for w, a, _ in EXAMPLES])
def test_console_examples_run(
    where: str, argv: list[str], shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] == "generate" and (not HAS_TORCH or "--model" in argv):
        pytest.skip("generate needs torch, and --model a downloaded model")
    if not HAS_HUB and len(argv) > 1 and HUB_ID.fullmatch(argv[1]) and not Path(argv[1]).exists():
        pytest.skip("Hugging Face ids need huggingface_hub")
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, f"{where}: kvpool {shlex.join(argv)} exited {code}: {out.err}"
    real = norm(out.out + out.err)
    missing = [s for s in shown if s.strip() and not ELIDED.search(s) and norm(s) not in real]
    assert not missing, f"{where}: kvpool {shlex.join(argv)} did not print {missing}"
