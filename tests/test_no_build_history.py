"""The repository speaks of the project alone: no word about how it was built.

Numbered working sessions or rounds, issue numbers of a tracker the repository does not have, and
helpers' demos mean nothing to a reader; the git history keeps them. This is the project's hook's
pattern, run over every tracked file, plus the same words without a number. pytest's own
"session" (hooks, fixtures, a part's session) is not matched.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|[0-9]+(?:st|nd|rd|th))"
)
HOOK = re.compile(
    rf"{ORDINAL} (?:session|round)|[Ss]ession [0-9]+|[Ii]ssues? [0-9]+(?:-[0-9]+)?\b|helper.s (?:demo|work)"
)
LOOSER = re.compile(r"\b(?:[Tt]his|the last|the next|the previous|an earlier|a later) (?:session|round)\b")
EXEMPT = {"tests/test_no_build_history.py"}  # it holds the patterns to test them


def hits(root: Path, paths: list[str]) -> list[str]:
    """'path:line: text' for every line of these files that speaks of how the project was built."""
    found = []
    for rel in paths:
        try:
            text = (root / rel).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # a binary, or a tracked file deleted in the work tree
        for n, line in enumerate(text.splitlines(), 1):
            if HOOK.search(line) or LOOSER.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown (an installed harness)")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
    return [p for p in out.stdout.splitlines() if p not in EXEMPT]


def test_no_tracked_file_speaks_of_how_the_project_was_built():
    assert hits(ROOT, tracked()) == []


@pytest.mark.parametrize(
    "line",
    [
        # Each planted line is split over two source lines, so that the repository's own grep (the
        # stop hook's, line by line) does not find this file's examples.
        "Measured on 2 x H200 (eleventh "
        "session): 51 s.",
        "## 2026-11-24 (second "
        "round)",
        "before this design (session "
        "31)",
        "the bench's gpus section (issue "
        "24)",
        "cited as issues "
        "20-24",
        "a helper's "
        "demo hit it",
        "not found this session",
    ],
)
def test_a_planted_line_is_found(tmp_path, line):
    (tmp_path / "doc.md").write_text(f"A first line.\n{line}\n")
    assert hits(tmp_path, ["doc.md"]) == [f"doc.md:2: {line}"]


@pytest.mark.parametrize(
    "line",
    [
        'the model checks ran in a fixture of scope="session"',
        "1.35 s after its pytest session",
        "a round trip through the pipe",
        "sessionstart and sessionfinish hooks",
    ],
)
def test_the_project_s_own_words_are_not_flagged(tmp_path, line):
    (tmp_path / "code.py").write_text(f"# {line}\n")
    assert hits(tmp_path, ["code.py"]) == []
