"""`pytest -k <keyword>` selects exactly its own family (and `-k swa` exactly the window tests)."""

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WINDOWED = ["decode", "prefill", "prefix", "draft_extend_v2", "verify", "encoder"]
FAMILY_TEST = {
    "decode": "test_decode",
    "prefill": "test_prefill",
    "prefix": "test_prefix",
    "draft_extend_v2": "test_draft_extend_v2",
    "verify": "test_verify",
    "cross": "test_cross",
    "encoder": "test_encoder",
}


@cache
def collect(keyword: str | None) -> tuple[str, ...]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q"]
    if keyword:
        cmd += ["-k", keyword]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode in (0, 5), res.stdout + res.stderr
    return tuple(line for line in res.stdout.splitlines() if "::" in line)


def test_bare_pytest_collects_the_suite_only():
    ids = collect(None)
    assert ids and all(i.startswith("cases/") for i in ids)


def test_swa_selects_exactly_the_window_tests_with_one_per_windowed_family():
    ids = collect("swa")
    everything = collect(None)
    assert set(ids) == {i for i in everything if i.endswith("-swa]")}
    for fam in WINDOWED:
        assert any(f"::{FAMILY_TEST[fam]}[" in i for i in ids), fam


@pytest.mark.parametrize("keyword", list(FAMILY_TEST))
def test_family_keyword_selects_its_family_only(keyword):
    ids = collect(keyword)
    everything = collect(None)
    mine = {i for i in everything if f"::{FAMILY_TEST[keyword]}[" in i}
    assert mine and set(ids) == mine


def test_backend_name_selects_that_backend():
    ids = collect("torch_native")
    assert ids and all("[torch_native-" in i for i in ids)
    assert set(ids) == {i for i in collect(None) if "[torch_native-" in i}
