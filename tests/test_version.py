"""The harness's version: one release in pyproject.toml and the source, named in every report."""

import re
from importlib import metadata
from pathlib import Path

import harness
from harness.report import environment, html
from tests.report_helpers import sample_document

ROOT = Path(__file__).resolve().parent.parent


def test_the_source_version_is_pyproject_s():
    declared = re.search(r'(?m)^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text())
    assert declared and harness.SOURCE_VERSION == declared.group(1)


def test_the_version_comes_from_the_installed_distribution_else_from_the_source(monkeypatch):
    monkeypatch.setattr(metadata, "version", lambda name: {"attn-harness": "9.8.7"}[name])
    assert harness.installed_version() == "9.8.7"

    def absent(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", absent)
    assert harness.installed_version() == harness.SOURCE_VERSION


def test_results_json_environment_and_the_html_header_name_the_version(monkeypatch):
    monkeypatch.setattr(harness, "__version__", "9.8.7")
    assert environment.harness_version().startswith("9.8.7 (")
    doc = sample_document()
    doc["environment"]["attn-harness"] = environment.harness_version()
    header = html.render(doc).split("<nav>")[0]
    assert re.search(r'attn-harness <span id="version">9\.8\.7 \(', header)


def test_a_report_without_a_version_says_so():
    header = html.render(sample_document()).split("<nav>")[0]
    assert 'attn-harness <span id="version">unknown</span>' in header
