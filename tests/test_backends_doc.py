"""docs/backends.md (and docs/catalogue.md) to the letter: every python block runs, and the lists of
Capabilities fields and engine-glue methods are the code's own."""

import dataclasses
import inspect
import re
import warnings
from pathlib import Path

import pytest

from harness.api import Capabilities, EngineGlue

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDES = ("backends.md", "catalogue.md")


def python_blocks(name: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (DOCS / name).read_text(), flags=re.M | re.S)


BLOCKS = [(name, i, code) for name in GUIDES for i, code in enumerate(python_blocks(name))]


def test_the_guides_have_examples():
    assert {name for name, _, _ in BLOCKS} == set(GUIDES)


@pytest.mark.parametrize(("name", "index", "code"), BLOCKS, ids=[f"{n}-{i}" for n, i, _ in BLOCKS])
def test_a_python_block_runs(name, index, code):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the guide imports from harness.api only
        exec(compile(code, f"docs/{name} block {index}", "exec"), {"__name__": f"doc_{index}"})


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end)]


def test_every_capabilities_field_is_listed_in_order():
    text = (DOCS / "backends.md").read_text()
    listed = re.findall(r"`(\w+)`", _section(text, "Every\nfield, in order:", "What that gives a check:"))
    fields = [f.name for f in dataclasses.fields(Capabilities)]
    assert listed == fields


def test_the_glue_table_gives_each_method_its_signature():
    text = (DOCS / "backends.md").read_text()
    rows = re.findall(r"^\| `(\w+)\(([^)]*)\)` \| `([^`]+)` \|", text, flags=re.M)
    shared = {n: m for n, m in vars(EngineGlue).items() if inspect.isfunction(m) and not n.startswith("_")}
    assert {name for name, _, _ in rows} == set(shared)
    for name, args, returns in rows:
        sig = inspect.signature(shared[name])
        assert [p.strip() for p in args.split(",")] == list(sig.parameters)[1:], name
        assert sig.return_annotation.replace("torch.", "") == returns, name
