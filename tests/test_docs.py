"""The docs name only what exists: repository paths, `python -m` modules, no machine-only paths.

Docs go stale silently when code moves; these checks make a moved module fail a test instead.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])

# A repository path in running text, a code span or a code block: a top-level folder of the
# repository and what follows it, up to the first character that cannot be in a path ("cases/s" is
# a rate, not a path).
TOP_DIRS = r"(?:harness|references|cases|tests|docs|examples|\.ci)"
PATH = re.compile(rf"(?<![\w./$-])(?!cases/s\b)({TOP_DIRS}/[\w./-]*)")
TOP_FILES = re.compile(r"`(Makefile|pyproject\.toml|conftest\.py|README\.md|CHANGELOG\.md)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
MODULE = re.compile(r"python3? -m (harness(?:\.\w+)+)")
MACHINE_ONLY = ("/root/", "/work/", "/tmp/", "gpu-env", ".device/", "DESIGN.md")


def named_paths(text: str) -> set[str]:
    """Repository paths a doc names (relative to the repository root), trailing punctuation cut."""
    found = {m.rstrip(".") for m in PATH.findall(text)}
    return found | set(TOP_FILES.findall(text))


def linked_paths(text: str) -> set[str]:
    """Targets of markdown links that are not URLs (relative to the doc's folder)."""
    return {t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")}


def missing(doc: Path, text: str) -> list[str]:
    """Every path the doc names or links to that is not in the repository."""
    gone = [p for p in sorted(named_paths(text)) if not (ROOT / p).exists()]
    gone += [t for t in sorted(linked_paths(text)) if not (doc.parent / t).exists()]
    return gone


def machine_only(text: str) -> list[str]:
    """Paths or names that exist only on some machine (or outside the repository)."""
    return [m for m in MACHINE_ONLY if m in text]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    assert missing(doc, doc.read_text()) == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_no_doc_names_a_machine_only_path(doc: Path) -> None:
    assert machine_only(doc.read_text()) == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_python_m_module_a_doc_names_imports(doc: Path) -> None:
    for name in sorted(set(MODULE.findall(doc.read_text()))):
        importlib.import_module(name)


def test_the_checks_catch_what_the_old_readme_got_wrong() -> None:
    old = (
        "harness/run/suite.py how cases/ is generated; harness/mutants.py the injected bugs\n"
        "Conventions (DESIGN.md has the full text); see [docs/bench.md](docs/bench.md)\n"
        "after `bash .device/core/setup.sh && . /root/gpu-env`"
    )
    assert missing(ROOT / "README.md", old) == ["harness/mutants.py"]
    assert machine_only(old) == ["/root/", "gpu-env", ".device/", "DESIGN.md"]
    assert named_paths("`harness/core/case.py`, tests/test_flex.py::test_x, 200 cases/s, harness/run/.") == {
        "harness/core/case.py",
        "tests/test_flex.py",
        "harness/run/",
    }
    assert linked_paths("[a](bench.md#json) [b](https://example.org/x)") == {"bench.md"}
