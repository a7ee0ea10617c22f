"""The catalogue of named batches: valid, varied, and named so that `-k` keeps selecting the searches."""

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
    text = (Path(__file__).resolve().parent.parent / "docs" / "catalogue.md").read_text()
    missing = [e.name for e in CATALOGUE if f"| `{e.name}` | {e.case.mode} | {e.models} |" not in text]
    assert not missing
