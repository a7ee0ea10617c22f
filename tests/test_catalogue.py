"""Selection by keyword: `pytest -k <keyword>` selects exactly its own family (and `-k swa` exactly
the window tests), and the catalogue of named batches is valid, varied, and named so that `-k` keeps
selecting the searches."""

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from harness import backends
from harness.core.case import Case
from harness.core.modes import FAMILIES, Mode
from harness.search.catalogue import BY_NAME, CATALOGUE, entry

KEYWORDS = (*FAMILIES, "swa")


def test_the_catalogue_is_small_and_named_once():
    assert 15 <= len(CATALOGUE) <= 30
    assert len(BY_NAME) == len(CATALOGUE)
    assert all(e.name.isidentifier() and e.models for e in CATALOGUE)


@pytest.mark.parametrize("e", CATALOGUE, ids=lambda e: e.name)
def test_an_entry_is_a_plain_case_that_replays_from_its_json(e):
    assert Case.from_json(e.case.to_json()) == e.case


@pytest.mark.parametrize("e", CATALOGUE, ids=lambda e: e.name)
def test_no_entry_name_holds_a_selection_keyword(e):
    assert not [k for k in KEYWORDS if k in e.name.lower()]


def test_every_mode_and_engine_feature_has_an_entry():
    cases = [e.case for e in CATALOGUE]
    assert {c.mode for c in cases} == set(Mode)
    assert any(c.hybrid_swa_pool for c in cases)
    assert any(c.kv_dtype for c in cases)
    assert any(c.soft_cap for c in cases) and any(c.sinks for c in cases)
    assert any(c.deterministic for c in cases) and any(c.window_right >= 0 for c in cases)
    assert any(c.num_q_heads > c.num_kv_heads for c in cases)
    assert any(r.tree and len(set(r.tree)) < len(r.tree) for c in cases for r in c.requests)  # a fork


def test_torch_native_declares_every_entry():
    b = backends.load("torch_native")
    assert {e.name: b.supports(e.case) for e in CATALOGUE} == dict.fromkeys(BY_NAME)


def test_an_unknown_entry_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="no catalogue entry 'nope'; known: mixed_step"):
        entry("nope")


def test_docs_catalogue_lists_every_entry_with_its_line():
    text = (ROOT / "docs" / "catalogue.md").read_text()
    missing = [e.name for e in CATALOGUE if f"| `{e.name}` | {e.case.mode} | {e.models} |" not in text]
    assert not missing


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
